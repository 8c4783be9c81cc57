package dockeripam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/unixsock"
)

// Defaults of Options.
const (
	// DefaultPluginSocket is where Docker looks for the "carve" IPAM driver.
	DefaultPluginSocket = "/run/docker/plugins/carve.sock"
	// DefaultDockerHost is the engine's usual socket.
	DefaultDockerHost = "unix:///var/run/docker.sock"
	// DefaultMTU is DESIGN.md's overlay_mtu, used when Options.MTU says nothing.
	DefaultMTU = 1420

	// DefaultEngineRetry is slow: an agent on a host without Docker should
	// cost nothing.
	DefaultEngineRetry = 30 * time.Second
	// DefaultSyncInterval bounds how late a new overlay gets its network when
	// the agent does not call Sync.
	DefaultSyncInterval = 10 * time.Second
	// DefaultGCInterval is the fallback period of the leak collection; events
	// trigger it sooner.
	DefaultGCInterval = time.Minute
	// DefaultGCGrace covers Docker's gap between allocating an address and
	// attaching the container (and a container start that takes long).
	DefaultGCGrace = 2 * time.Minute

	// engineCallTimeout bounds one engine call (not the event stream).
	engineCallTimeout = 20 * time.Second
	// eventDebounce groups the events of one container removal into one collection.
	eventDebounce = time.Second
)

// Docker network options carve sets (moby's netlabel and bridge driver).
const (
	optBridgeName = "com.docker.network.bridge.name"
	optMasquerade = "com.docker.network.bridge.enable_ip_masquerade"
	optMTU        = "com.docker.network.driver.mtu"
	// LabelOverlay marks the Docker networks carve created.
	LabelOverlay = "net.carve.overlay"
)

// DefaultNetworkName is the default template of an overlay's Docker
// network name: the overlay's own name, as DC/OS names it, since that is
// what its Docker containerizer passes to --net.
const DefaultNetworkName = OverlayPlaceholder

// OverlayPlaceholder is replaced by the overlay's name in a network name
// template (Options.NetworkName).
const OverlayPlaceholder = "{overlay}"

// BridgeName is the Linux bridge of an overlay's Docker network, d-<overlay>
// (DC/OS's docker_bridge), whatever the network is named.
func BridgeName(overlay string) string { return "d-" + overlay }

// LegacyNetworkName is the name carve gave an overlay's Docker network
// before the name followed DC/OS: the bridge's. Such a network is migrated
// (see Service.ensureOne).
func LegacyNetworkName(overlay string) string { return BridgeName(overlay) }

// NetworkName renders a network name template for an overlay.
func NetworkName(template, overlay string) string {
	return strings.ReplaceAll(template, OverlayPlaceholder, overlay)
}

// ValidateNetworkName checks a network name template: it must name each
// overlay apart (contain OverlayPlaceholder) and give names Docker accepts
// ([a-zA-Z0-9][a-zA-Z0-9_.-]*, at most 64 characters with the longest
// overlay name).
func ValidateNetworkName(template string) error {
	if !strings.Contains(template, OverlayPlaceholder) {
		return fmt.Errorf("docker network name %q: want a template containing %s (each overlay needs a network of its own)", template, OverlayPlaceholder)
	}
	name := NetworkName(template, "abcdefghij-13")
	if len(name) > 64 {
		return fmt.Errorf("docker network name %q: %q is longer than 64 characters", template, name)
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || i > 0 && (r == '_' || r == '.' || r == '-')
		if !ok {
			return fmt.Errorf("docker network name %q: %q is not a Docker network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)", template, name)
		}
	}
	return nil
}

// Options configure a Service. Zero values take the defaults.
type Options struct {
	// PluginSocket is the plugin's unix socket; Docker names the IPAM driver
	// after its base name without ".sock". Docker only discovers plugins in
	// /run/docker/plugins, /etc/docker/plugins and /usr/lib/docker/plugins.
	PluginSocket string
	// SocketGID is the group of the plugin socket (mode 0660, owner root):
	// Docker runs as root; the group may reach it too.
	SocketGID int
	// DockerHost is the engine, unix:///path.
	DockerHost string
	// NetworkName is the template of the Docker networks' names, in which
	// OverlayPlaceholder stands for the overlay (default
	// DefaultNetworkName: the overlay's name, as in DC/OS). The bridge is
	// BridgeName whatever the network's name.
	NetworkName string
	// MTU returns an overlay's MTU (its bridge's); nil, or 0, means DefaultMTU.
	MTU    func(overlay string) int
	Logger *slog.Logger

	// EngineRetry is how long to wait before trying an absent engine again.
	EngineRetry time.Duration
	// SyncInterval is how often the overlays are checked for new ones
	// (Service.Sync checks at once).
	SyncInterval time.Duration
	// GCInterval is the period of the leak collection (events also trigger it).
	GCInterval time.Duration
	// GCGrace is how long an allocation must be seen unused by any container
	// before the collector releases it.
	GCGrace time.Duration
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Service is the Docker side of an agent: the IPAM plugin and the engine loop.
type Service struct {
	opts   Options
	log    *slog.Logger
	name   string
	driver *driver
	syncCh chan struct{}
	gcCh   chan chan error

	mu     sync.Mutex
	status Status
	logged map[string]string // what was last logged per subject, to log changes once
	// ensured is, per overlay, the desired network last found in place.
	ensured map[string]string
}

// Status is the Docker side's state, for the agent's HTTP API.
type Status struct {
	Plugin   PluginStatus    `json:"plugin"`
	Engine   EngineStatus    `json:"engine"`
	Networks []NetworkStatus `json:"networks"`
	GC       GCStatus        `json:"gc"`
}

// PluginStatus is the IPAM driver's socket.
type PluginStatus struct {
	Socket  string `json:"socket"`
	Driver  string `json:"driver"`
	Serving bool   `json:"serving"`
	Error   string `json:"error,omitempty"`
}

// EngineStatus tells whether a Docker engine answers.
type EngineStatus struct {
	Host       string `json:"host"`
	Connected  bool   `json:"connected"`
	Version    string `json:"version,omitempty"`
	APIVersion string `json:"api_version,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Network states, in NetworkStatus.State.
const (
	// NetworkPending: not checked yet (no engine, or the overlay just appeared).
	NetworkPending = "pending"
	// NetworkOK: the Docker network exists with carve's settings.
	NetworkOK = "ok"
	// NetworkMismatch: a network of that name exists with other settings;
	// carve leaves it alone rather than break its containers.
	NetworkMismatch = "mismatch"
	// NetworkError: the engine refused or failed a call; retried.
	NetworkError = "error"
	// NetworkLegacy: the network an older carve created under the legacy
	// name d-<overlay> still has containers; it keeps working, and carve
	// replaces it by the network of the configured name once it is empty.
	NetworkLegacy = "legacy"
)

// NetworkStatus is one overlay's Docker network.
type NetworkStatus struct {
	Overlay string `json:"overlay"`
	Name    string `json:"name"`
	ID      string `json:"id,omitempty"`
	State   string `json:"state"`
	Error   string `json:"error,omitempty"`
}

// GCStatus is the leak collector's last run.
type GCStatus struct {
	LastRun  time.Time `json:"last_run,omitzero"`
	Released int       `json:"released"`
	Error    string    `json:"error,omitempty"`
}

// New prepares a Service; Run starts it.
func New(svc AddressService, opts Options) (*Service, error) {
	if svc == nil {
		return nil, errors.New("dockeripam: no address service")
	}
	if opts.PluginSocket == "" {
		opts.PluginSocket = DefaultPluginSocket
	}
	if opts.DockerHost == "" {
		opts.DockerHost = DefaultDockerHost
	}
	if opts.NetworkName == "" {
		opts.NetworkName = DefaultNetworkName
	}
	if err := ValidateNetworkName(opts.NetworkName); err != nil {
		return nil, fmt.Errorf("dockeripam: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.EngineRetry <= 0 {
		opts.EngineRetry = DefaultEngineRetry
	}
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = DefaultSyncInterval
	}
	if opts.GCInterval <= 0 {
		opts.GCInterval = DefaultGCInterval
	}
	if opts.GCGrace <= 0 {
		opts.GCGrace = DefaultGCGrace
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	name := strings.TrimSuffix(filepath.Base(opts.PluginSocket), ".sock")
	if !strings.HasSuffix(opts.PluginSocket, ".sock") || name == "" || !filepath.IsAbs(opts.PluginSocket) {
		return nil, fmt.Errorf("dockeripam: plugin socket %q: want an absolute path ending in <driver name>.sock", opts.PluginSocket)
	}
	if _, err := newEngineClient(opts.DockerHost); err != nil {
		return nil, fmt.Errorf("dockeripam: %w", err)
	}
	log := opts.Logger.With("component", "docker")
	s := &Service{
		opts: opts, log: log, name: name, driver: newDriver(svc, log, opts.Now),
		syncCh: make(chan struct{}, 1), gcCh: make(chan chan error),
		logged: map[string]string{}, ensured: map[string]string{},
	}
	s.status.Plugin = PluginStatus{Socket: opts.PluginSocket, Driver: name}
	s.status.Engine = EngineStatus{Host: opts.DockerHost, Error: "not tried yet"}
	return s, nil
}

// DriverName is the IPAM driver name Docker knows the plugin by.
func (s *Service) DriverName() string { return s.name }

// Handler serves the plugin protocol (Run serves it on the plugin socket).
func (s *Service) Handler() http.Handler { return s.driver }

// Sync asks the engine loop to check the overlays now (the agent calls it
// when its leases change). It never blocks.
func (s *Service) Sync() {
	select {
	case s.syncCh <- struct{}{}:
	default:
	}
}

// CollectNow runs a leak collection in the engine loop and waits for it; it
// fails when no engine is connected or ctx ends first.
func (s *Service) CollectNow(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case s.gcCh <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status is a copy of the current state.
func (s *Service) Status() *Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Networks = slices.Clone(s.status.Networks)
	return &st
}

// Run serves the plugin socket and runs the engine loop until ctx ends. It
// fails only when the socket cannot be served; an absent engine is a
// status, retried every EngineRetry.
func (s *Service) Run(ctx context.Context) error {
	s.driver.gated.Store(true)
	ln, err := unixsock.Listen(s.opts.PluginSocket, s.opts.SocketGID)
	if err != nil {
		s.setPlugin(false, err)
		return fmt.Errorf("dockeripam: plugin socket: %w", err)
	}
	s.setPlugin(true, nil)
	s.log.Info("docker IPAM plugin serving", "socket", s.opts.PluginSocket, "driver", s.name)
	srv := httpapi.NewServer(s.driver, httpapi.ServerOptions{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	loopDone := make(chan struct{})
	loopCtx, stopLoop := context.WithCancel(ctx)
	go func() {
		defer close(loopDone)
		s.engineLoop(loopCtx)
	}()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	stopLoop()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(shut)
	cancel()
	<-loopDone
	// Unix listeners remove their socket file on Close.
	s.setPlugin(false, nil)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("dockeripam: plugin socket: %w", serveErr)
	}
	return nil
}

func (s *Service) setPlugin(serving bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.Plugin.Serving = serving
	s.status.Plugin.Error = ""
	if err != nil {
		s.status.Plugin.Error = err.Error()
	}
}

// note logs msg at level when it differs from what was last logged about
// subject, so that a state that persists is logged once, not every retry.
func (s *Service) note(subject string, level slog.Level, msg string, args ...any) {
	key := msg + fmt.Sprint(args...)
	s.mu.Lock()
	same := s.logged[subject] == key
	s.logged[subject] = key
	s.mu.Unlock()
	if !same {
		s.log.Log(context.Background(), level, msg, args...)
	}
}

// engineLoop connects to the engine, retrying slowly while there is none.
func (s *Service) engineLoop(ctx context.Context) {
	for {
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		// No engine at the configured host: there are no containers of its
		// to take back addresses for, so requests need not wait.
		s.driver.ready.Store(true)
		s.mu.Lock()
		s.status.Engine = EngineStatus{Host: s.opts.DockerHost, Error: err.Error()}
		for i := range s.status.Networks {
			if s.status.Networks[i].State == NetworkOK {
				s.status.Networks[i].State = NetworkPending
			}
		}
		s.mu.Unlock()
		s.note("engine", slog.LevelWarn, "docker engine unavailable; retrying", "host", s.opts.DockerHost, "err", err, "retry", s.opts.EngineRetry)
		t := time.NewTimer(s.opts.EngineRetry)
	wait:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				break wait
			case done := <-s.gcCh:
				done <- fmt.Errorf("no Docker engine connected: %w", err)
			}
		}
	}
}

// session runs while the engine answers: it ensures the networks, follows
// the events and collects leaks. It returns why the engine was lost.
func (s *Service) session(ctx context.Context) error {
	c, err := newEngineClient(s.opts.DockerHost)
	if err != nil {
		return err
	}
	defer c.close()
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	v, err := c.connect(cctx)
	cancel()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.status.Engine = EngineStatus{Host: s.opts.DockerHost, Connected: true, Version: v.Version, APIVersion: c.version}
	s.mu.Unlock()
	s.note("engine", slog.LevelInfo, "docker engine connected", "host", s.opts.DockerHost, "version", v.Version, "api", c.version)

	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	evCh := make(chan struct{}, 1)
	evErr := make(chan error, 1)
	startEvents := func() {
		go func() {
			evErr <- c.events(evCtx, func(ev event) {
				s.log.Debug("docker event", "type", ev.Type, "action", ev.Action, "actor", ev.Actor.ID)
				select {
				case evCh <- struct{}{}:
				default:
				}
			})
		}()
	}
	startEvents()

	s.ensureAll(ctx, c)
	// A failed first collection is not fatal: the periodic one retries.
	_ = s.collect(ctx, c)

	syncT := time.NewTicker(s.opts.SyncInterval)
	defer syncT.Stop()
	gcT := time.NewTicker(s.opts.GCInterval)
	defer gcT.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.syncCh:
			s.ensureAll(ctx, c)
		case <-syncT.C:
			s.ensureNew(ctx, c)
		case <-gcT.C:
			// Also re-checks the networks: one removed by hand comes back.
			s.ensureAll(ctx, c)
			_ = s.collect(ctx, c)
		case <-evCh:
			debounce.Reset(eventDebounce)
		case <-debounce.C:
			_ = s.collect(ctx, c)
		case done := <-s.gcCh:
			done <- s.collect(ctx, c)
		case err := <-evErr:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The stream broke: the engine stopped, or restarted.
			pctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
			_, perr := c.connect(pctx)
			cancel()
			if perr != nil {
				return perr
			}
			s.note("events", slog.LevelWarn, "docker event stream ended; following it again", "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			startEvents()
		}
	}
}

// desiredNetwork is the Docker network carve wants for an overlay.
func (s *Service) desiredNetwork(overlay string) (dockerNetwork, bool) {
	v4, v6, ok := s.driver.svc.BridgeSubnets(overlay, api.BridgeDocker)
	if !ok || (!v4.IsValid() && !v6.IsValid()) {
		return dockerNetwork{}, false
	}
	mtu := 0
	if s.opts.MTU != nil {
		mtu = s.opts.MTU(overlay)
	}
	if mtu <= 0 {
		mtu = DefaultMTU
	}
	n := dockerNetwork{Name: NetworkName(s.opts.NetworkName, overlay), Driver: "bridge", EnableIPv6: v6.IsValid()}
	n.IPAM.Driver = s.name
	n.IPAM.Options = map[string]string{OptionNetwork: overlay}
	for _, p := range []poolID{{prefix: v4}, {prefix: v6, v6: true}} {
		if p.prefix.IsValid() {
			p.prefix = p.prefix.Masked()
			n.IPAM.Config = append(n.IPAM.Config, ipamConfig{Subnet: p.prefix.String(), Gateway: p.gateway().String()})
		}
	}
	n.Options = map[string]string{
		optBridgeName: BridgeName(overlay),
		optMasquerade: "false",
		optMTU:        strconv.Itoa(mtu),
	}
	n.Labels = map[string]string{LabelOverlay: overlay}
	return n, true
}

// differences lists how an existing network differs from the desired one.
func differences(have *dockerNetwork, want dockerNetwork) []string {
	var out []string
	diff := func(what, h, w string) {
		if h != w {
			if h == "" {
				h = "unset"
			}
			out = append(out, fmt.Sprintf("%s is %s (want %s)", what, h, w))
		}
	}
	diff("driver", have.Driver, want.Driver)
	diff("IPAM driver", have.IPAM.Driver, want.IPAM.Driver)
	diff("IPAM option "+OptionNetwork, have.IPAM.Options[OptionNetwork], want.IPAM.Options[OptionNetwork])
	subnets := func(cs []ipamConfig) string {
		var ss []string
		for _, c := range cs {
			s := c.Subnet
			if c.Gateway != "" {
				s += " gateway " + c.Gateway
			}
			if c.IPRange != "" {
				s += " range " + c.IPRange
			}
			ss = append(ss, s)
		}
		slices.Sort(ss)
		return strings.Join(ss, ", ")
	}
	diff("subnets", subnets(have.IPAM.Config), subnets(want.IPAM.Config))
	diff("IPv6", strconv.FormatBool(have.EnableIPv6), strconv.FormatBool(want.EnableIPv6))
	for _, k := range []string{optBridgeName, optMTU, optMasquerade} {
		diff("option "+k, have.Options[k], want.Options[k])
	}
	return out
}

// ensureAll checks (and creates) the network of every overlay.
func (s *Service) ensureAll(ctx context.Context, c *engineClient) { s.ensure(ctx, c, false) }

// ensureNew checks only overlays that are new, changed or not yet OK.
func (s *Service) ensureNew(ctx context.Context, c *engineClient) { s.ensure(ctx, c, true) }

func (s *Service) ensure(ctx context.Context, c *engineClient, onlyNew bool) {
	prev := map[string]NetworkStatus{}
	s.mu.Lock()
	for _, n := range s.status.Networks {
		prev[n.Overlay] = n
	}
	s.mu.Unlock()
	var out []NetworkStatus
	for _, ov := range s.driver.svc.Networks() {
		want, ok := s.desiredNetwork(ov)
		if !ok {
			continue
		}
		spec, _ := json.Marshal(want)
		s.mu.Lock()
		same := s.ensured[ov] == string(spec)
		s.mu.Unlock()
		if p, seen := prev[ov]; onlyNew && seen && p.State == NetworkOK && same {
			out = append(out, p)
			continue
		}
		st := s.ensureOne(ctx, c, ov, want)
		s.mu.Lock()
		if st.State == NetworkOK {
			s.ensured[ov] = string(spec)
		} else {
			delete(s.ensured, ov)
		}
		s.mu.Unlock()
		out = append(out, st)
	}
	s.mu.Lock()
	s.status.Networks = out
	s.mu.Unlock()
}

func (s *Service) ensureOne(ctx context.Context, c *engineClient, overlay string, want dockerNetwork) NetworkStatus {
	st := NetworkStatus{Overlay: overlay, Name: want.Name}
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	have, err := c.inspectNetwork(cctx, want.Name)
	if errors.Is(err, errNotFound) {
		if legacy, ok := s.migrateLegacy(cctx, c, overlay, want); !ok {
			return legacy
		}
		id, cerr := c.createNetwork(cctx, want)
		if cerr == nil {
			s.log.Info("created docker network", "network", want.Name, "id", id, "subnets", want.IPAM.Config, "driver", s.name)
			st.ID, st.State = id, NetworkOK
			s.note("net/"+overlay, slog.LevelDebug, "docker network ok", "network", want.Name)
			return st
		}
		var ae *api.Error
		if !errors.As(cerr, &ae) || ae.Status != http.StatusConflict {
			st.State, st.Error = NetworkError, fmt.Sprintf("create Docker network %s: %v", want.Name, cerr)
			s.note("net/"+overlay, slog.LevelError, "docker network not created", "network", want.Name, "err", cerr)
			return st
		}
		// Created meanwhile by someone else: look at it.
		have, err = c.inspectNetwork(cctx, want.Name)
	}
	if err != nil {
		st.State, st.Error = NetworkError, fmt.Sprintf("inspect Docker network %s: %v", want.Name, err)
		s.note("net/"+overlay, slog.LevelError, "docker network not inspected", "network", want.Name, "err", err)
		return st
	}
	st.ID = have.ID
	if diffs := differences(have, want); have.Name == want.Name && len(diffs) > 0 {
		st.State = NetworkMismatch
		st.Error = fmt.Sprintf("Docker network %s exists with other settings: %s; carve leaves it alone (remove it with `docker network rm %s` and carve recreates it)",
			want.Name, strings.Join(diffs, "; "), want.Name)
		s.note("net/"+overlay, slog.LevelWarn, st.Error, "network", want.Name)
		return st
	}
	if have.Name != want.Name {
		st.State, st.Error = NetworkError, fmt.Sprintf("Docker resolved %s to network %q", want.Name, have.Name)
		return st
	}
	st.State = NetworkOK
	s.note("net/"+overlay, slog.LevelDebug, "docker network ok", "network", want.Name)
	return st
}

// migrateLegacy handles the network an older carve created for the overlay
// under its legacy name d-<overlay>, when the configured name is another
// and no network of that name exists yet: both cannot exist, since they
// would share the bridge. The legacy network is removed when no container
// uses it (Docker refuses to remove a network with endpoints, so a
// container attaching meanwhile is safe), and the caller creates the new
// one. While containers use it, it stays and keeps working (its IPAM
// driver is this plugin, so the leak collector covers it) and the status
// says so; every pass tries again. A network of that name that carve did
// not create is not touched. It returns false with the status to report
// when the caller must not create the new network now.
func (s *Service) migrateLegacy(ctx context.Context, c *engineClient, overlay string, want dockerNetwork) (NetworkStatus, bool) {
	name := LegacyNetworkName(overlay)
	if want.Name == name {
		return NetworkStatus{}, true
	}
	old, err := c.inspectNetwork(ctx, name)
	if errors.Is(err, errNotFound) {
		return NetworkStatus{}, true
	}
	st := NetworkStatus{Overlay: overlay, Name: want.Name}
	if err != nil {
		st.State, st.Error = NetworkError, fmt.Sprintf("inspect Docker network %s (the legacy name): %v", name, err)
		return st, false
	}
	if old.Labels[LabelOverlay] != overlay || old.IPAM.Driver != s.name {
		return NetworkStatus{}, true // not carve's: creating ours reports any conflict
	}
	if len(old.Containers) == 0 {
		if err := c.removeNetwork(ctx, old.ID); err != nil && !errors.Is(err, errNotFound) {
			st.State, st.Error = NetworkLegacy, fmt.Sprintf("Docker network %s of an older carve could not be removed (%v); %s is created once it is gone", name, err, want.Name)
			s.note("net/"+overlay, slog.LevelWarn, st.Error, "network", name)
			return st, false
		}
		s.log.Info("removed the Docker network of an older carve, unused; creating it under its new name", "old", name, "new", want.Name, "overlay", overlay)
		return NetworkStatus{}, true
	}
	st.ID, st.State = old.ID, NetworkLegacy
	st.Error = fmt.Sprintf("Docker network %s of an older carve still has %d containers: it keeps working, and carve replaces it by %s once they are gone", name, len(old.Containers), want.Name)
	s.note("net/"+overlay, slog.LevelWarn, st.Error, "network", name)
	return st, false
}

// collect releases the docker-bridge allocations that no container of the
// engine uses and that have been unused for GCGrace. It releases nothing
// when the engine cannot be listed completely.
func (s *Service) collect(ctx context.Context, c *engineClient) error {
	used, eps, err := s.usedAddresses(ctx, c)
	now := s.opts.Now()
	if err != nil {
		s.mu.Lock()
		s.status.GC.LastRun, s.status.GC.Error = now, err.Error()
		s.mu.Unlock()
		s.note("gc", slog.LevelWarn, "docker leak collection skipped: the engine's endpoints could not be listed", "err", err)
		return err
	}
	// Addresses running containers hold that the agent does not know (it
	// lost its data dir) are claimed back first; only then may new
	// addresses be handed out.
	s.driver.reclaim(eps)
	released, err := s.driver.collect(used, now, s.opts.GCGrace)
	s.mu.Lock()
	s.status.GC.LastRun = now
	s.status.GC.Released += released
	s.status.GC.Error = ""
	if err != nil {
		s.status.GC.Error = err.Error()
	}
	s.mu.Unlock()
	if err != nil {
		s.note("gc", slog.LevelWarn, "docker leak collection", "err", err)
	} else {
		s.note("gc", slog.LevelDebug, "docker leak collection ok")
	}
	return err
}

// dockerEndpoint is an address an endpoint holds on one of the plugin's networks.
type dockerEndpoint struct {
	overlay    string
	endpointID string
	// containerID and name are the engine's container (name may be empty).
	containerID string
	name        string
	addr        netip.Addr
}

// usedAddresses lists the addresses of every endpoint on the networks whose
// IPAM driver is this plugin, and those endpoints with their overlay.
func (s *Service) usedAddresses(ctx context.Context, c *engineClient) (map[string]bool, []dockerEndpoint, error) {
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	nets, err := c.listNetworks(cctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list Docker networks: %w", err)
	}
	used := map[string]bool{}
	var eps []dockerEndpoint
	for _, n := range nets {
		if n.IPAM.Driver != s.name {
			continue
		}
		full, err := c.inspectNetwork(cctx, n.ID)
		if err != nil {
			return nil, nil, fmt.Errorf("inspect Docker network %s: %w", n.Name, err)
		}
		// The overlay, whatever the network's name (legacy or templated).
		overlay := full.IPAM.Options[OptionNetwork]
		if overlay == "" {
			overlay = full.Labels[LabelOverlay]
		}
		for id, ep := range full.Containers {
			for _, a := range []string{ep.IPv4Address, ep.IPv6Address} {
				if addr, err := parseAddr(a); err == nil {
					used[addr.String()] = true
					if overlay == "" {
						continue // no overlay to take the address back on
					}
					epID := ep.EndpointID
					if epID == "" {
						epID = id
					}
					eps = append(eps, dockerEndpoint{overlay: overlay, endpointID: epID, containerID: id, name: ep.Name, addr: addr})
				}
			}
		}
	}
	return used, eps, nil
}

// reclaim claims, for the endpoints' addresses that no allocation holds, an
// attachment named after the endpoint (Docker releases by address, so the
// name only has to be unique), and opens the driver for new requests.
func (d *driver) reclaim(eps []dockerEndpoint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.ready.Store(true)
	held := map[string]map[netip.Addr]bool{}
	claimed := 0
	for _, ep := range eps {
		if held[ep.overlay] == nil {
			held[ep.overlay] = map[netip.Addr]bool{}
			for _, a := range d.svc.List(ep.overlay).Allocations {
				for _, ip := range a.IPs {
					if addr, err := parseAddr(ip.Address); err == nil {
						held[ep.overlay][addr] = true
					}
				}
			}
		}
		if held[ep.overlay][ep.addr] {
			continue
		}
		id := ep.endpointID
		if len(id) > 16 {
			id = id[:16]
		}
		req := api.IPAMRequest{Network: ep.overlay, ContainerID: attachmentPrefix + "ep-" + id, IfName: "eth0",
			Bridge: api.BridgeDocker, Address: ep.addr.String(), Family: "4",
			Owner: &api.Owner{Runtime: api.RuntimeDocker, EndpointID: ep.endpointID, ContainerID: ep.containerID, ContainerName: ep.name}}
		if ep.addr.Is6() {
			req.IfName, req.Family = "eth0-v6", "6"
		}
		if _, err := d.svc.Allocate(req); err != nil {
			d.log.Error("could not take back the address of a running container", "overlay", ep.overlay, "endpoint", ep.endpointID, "address", ep.addr, "err", err)
			continue
		}
		held[ep.overlay][ep.addr] = true
		claimed++
	}
	if claimed > 0 {
		d.log.Warn("took back the addresses of running Docker containers", "count", claimed)
	}
}

// collect is the decision, under the driver's lock so that no request for
// the same attachment interleaves: an allocation is released when none of
// its addresses is in used and it was already seen unused grace ago.
func (d *driver) collect(used map[string]bool, now time.Time, grace time.Duration) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[string]bool{}
	released := 0
	var errs []error
	for _, ov := range d.svc.Networks() {
		for _, a := range d.svc.List(ov).Allocations {
			if a.Bridge != api.BridgeDocker {
				continue
			}
			key := attachmentKey(ov, a.ContainerID, a.IfName)
			inUse := false
			for _, ip := range a.IPs {
				if addr, err := parseAddr(ip.Address); err == nil && used[addr.String()] {
					inUse = true
				}
			}
			if inUse {
				continue
			}
			seen[key] = true
			since, ok := d.unusedSince[key]
			if !ok {
				d.unusedSince[key] = now
				continue
			}
			if now.Sub(since) < grace {
				continue
			}
			if _, err := d.svc.Release(api.IPAMRequest{Network: ov, ContainerID: a.ContainerID, IfName: a.IfName, Bridge: api.BridgeDocker}); err != nil {
				errs = append(errs, fmt.Errorf("release %s/%s on %s: %w", a.ContainerID, a.IfName, ov, err))
				continue
			}
			delete(d.unusedSince, key)
			released++
			d.log.Info("released an address no container uses", "overlay", ov, "attachment", a.ContainerID, "ifname", a.IfName, "addresses", a.IPs, "unused_since", since)
		}
	}
	for k := range d.unusedSince {
		if !seen[k] {
			delete(d.unusedSince, k)
		}
	}
	return released, errors.Join(errs...)
}
