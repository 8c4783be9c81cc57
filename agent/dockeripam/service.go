package dockeripam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/internal/goroutines"
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
	// TakeBackWait bounds how long a RequestAddress waits for the
	// take-back of running containers' addresses (DefaultTakeBackWait).
	TakeBackWait time.Duration
	// TakeBackRetry is how soon a take-back that waits for the agent is
	// tried again (DefaultTakeBackRetry).
	TakeBackRetry time.Duration
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
	// Containers are the addresses running containers hold on the plugin's
	// networks, as the engine listed them at ContainersListed (the last
	// collection; none while no engine answers): carve ipam check compares
	// them with the agent's allocations.
	Containers       []ContainerAddress `json:"containers"`
	ContainersListed time.Time          `json:"containers_listed,omitzero"`
	// TakeBackWaiting names the overlays whose running containers'
	// addresses could not be taken back yet, with why: requests for
	// addresses on them wait.
	TakeBackWaiting map[string]string `json:"take_back_waiting,omitempty"`
}

// ContainerAddress is an address a container's endpoint holds, as the
// engine lists it.
type ContainerAddress struct {
	Overlay     string `json:"overlay"`
	Address     string `json:"address"`
	ContainerID string `json:"container_id"`
	Name        string `json:"name,omitempty"`
	EndpointID  string `json:"endpoint_id,omitempty"`
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
	// Absent: nothing listens at the host's socket path (no file there):
	// Docker is not installed or not started on this host.
	Absent bool `json:"absent,omitempty"`
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
	if opts.TakeBackWait <= 0 {
		opts.TakeBackWait = DefaultTakeBackWait
	}
	if opts.TakeBackRetry <= 0 {
		opts.TakeBackRetry = DefaultTakeBackRetry
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
	s.driver.takeBackWait = opts.TakeBackWait
	s.driver.servedBy = s.networkServing
	s.driver.networkTemplate = opts.NetworkName
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
	// The driver's lock is never taken under s.mu.
	waiting := s.driver.takeBackWaitingFor()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Networks = slices.Clone(s.status.Networks)
	st.Containers = slices.Clone(s.status.Containers)
	if st.Containers == nil {
		st.Containers = []ContainerAddress{}
	}
	st.TakeBackWaiting = waiting
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
	// The server and the engine loop are goroutines Run owns: both have
	// ended when it returns.
	bg := goroutines.New(ctx)
	served := make(chan error, 1)
	bg.Go(func(context.Context) { served <- srv.Serve(ln) })
	loopCtx, stopLoop := context.WithCancel(ctx)
	defer stopLoop()
	bg.Go(func(context.Context) { s.engineLoop(loopCtx) })
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	stopLoop()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(shut)
	cancel()
	bg.Stop()
	// Unix listeners remove their socket file on Close.
	s.setPlugin(false, nil)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("dockeripam: plugin socket: %w", serveErr)
	}
	return nil
}

// networkServing is the Docker network the engine loop last found serving
// overlay's docker range ("" when none).
func (s *Service) networkServing(overlay string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.status.Networks {
		switch {
		case n.Overlay != overlay || n.ID == "":
		case n.State == NetworkOK:
			return n.Name
		case n.State == NetworkLegacy:
			return LegacyNetworkName(overlay)
		}
	}
	return ""
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
