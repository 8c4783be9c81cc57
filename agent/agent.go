// Package agent is the carve agent daemon: it registers with the masters,
// learns every other agent from the masters' state watch and from mesh
// gossip (merged by record version, with tombstones), keeps its last known
// state on disk so that it works while no master answers, and reconciles its
// kernel (package vxlan) to the desired dataplane on every change and on a
// periodic full resync.
package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/internal/unixsock"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/vxlan"
)

// GossipChannel is the mesh channel that carries agent records.
const GossipChannel = "carve-agents"

// Defaults of the agent's timing.
const (
	DefaultResyncInterval = 30 * time.Second
	DefaultWatchWait      = 30 * time.Second
	// firstRetry and maxRetry bound registration retries: the first retry
	// comes within 5 s, later ones at most a minute apart.
	firstRetry = 2 * time.Second
	maxRetry   = time.Minute
	// maxWatchRetry caps the state watch's retries lower: gossip covers
	// the gap, but masters that come back should be followed soon.
	maxWatchRetry = 10 * time.Second
)

// Router is a gossip router the agent can start, stop and point at peers.
type Router interface {
	gossip.Router
	Start() error
	// Connect has the router connect to peers at these HOST:PORT
	// addresses, and keep trying them.
	Connect(addrs ...string) error
	// Forget has the router stop trying addresses given to Connect.
	Forget(addrs ...string) error
	Stop() error
}

// Config configures an agent.
type Config struct {
	DataDir string
	Masters []string
	// ID fixes the agent id; empty means the persisted one (created on first start).
	ID string
	// IP is the underlay IP; invalid means the source address of the route
	// towards the first master.
	IP       netip.Addr
	Hostname string
	// HTTPAddr is where the agent's HTTP API listens.
	HTTPAddr string
	// DebugAddr, when set, is where the agent serves Go's runtime
	// profiles (/debug/pprof/, plain http, no client certificates): for
	// an operator finding where its CPU goes, on loopback. Empty: none.
	DebugAddr string
	// Socket is the unix socket of the IPAM service.
	Socket string
	// SocketGID is the group of the IPAM socket and of the Docker plugin
	// socket (mode 0660, owner root); 0 is root's group.
	SocketGID int
	// CNIConfDir receives a <overlay>.conflist per overlay with a mesos
	// bridge; empty writes none.
	CNIConfDir string
	// MesosCNIConfDir receives, as well, a single-plugin <overlay>.conf per
	// such overlay for the Mesos CNI isolator (which skips conflists);
	// empty writes none.
	MesosCNIConfDir string
	// DockerPluginSocket is where the Docker remote IPAM plugin listens (with
	// DockerBridge); empty disables the plugin.
	DockerPluginSocket string
	// DockerHost is the Docker engine the agent creates its networks on.
	DockerHost string
	// DockerNetworkName is the template of the Docker networks' names
	// (dockeripam.Options.NetworkName); empty is the overlay's name.
	DockerNetworkName string
	// CNICacheDir is the runtime's libcni cache (results/), read to take
	// back the addresses of running containers after a lost disk; empty: none.
	CNICacheDir string
	// BlockSource is the masters' side of growth (more lease for a bridge,
	// grant reports, returns, and usage reports when it is an
	// ipam.UsageReporter); nil: the masters' client.
	BlockSource ipam.BlockSource
	// UsageInterval is the least time between two usage reports to the
	// masters (0: 5s; negative: none).
	UsageInterval time.Duration
	// GrowLowWater is a bridge's free addresses below which it grows (0:
	// max(2, 1/8 of its first block); negative: only when full).
	GrowLowWater int
	// BlockIdleReturn is how long a grown block stays empty before it goes
	// back (0: 10 minutes; negative: never).
	BlockIdleReturn time.Duration
	// Reclaim releases the addresses of CNI containers whose network
	// namespace is gone (ipam.ReclaimConfig; the zero value: off).
	Reclaim ipam.ReclaimConfig
	// MeshAddr is where mesh listens (HOST:PORT); it is advertised to other
	// agents through the masters. Empty means IP:6783.
	MeshAddr string
	// MeshPeers bounds the peers the agent keeps mesh connections to (it
	// accepts connections from others too, up to mesh's limit); 0 means
	// DefaultMeshPeers.
	MeshPeers    int
	MesosBridge  bool
	DockerBridge bool
	// ResyncInterval is the period of the full kernel resync.
	ResyncInterval time.Duration
	// WatchWait is how long one blocking state query waits.
	WatchWait time.Duration
	// NetNS is the namespace to program (tests); zero means the agent's own.
	NetNS netns.NsHandle
	// NewRouter builds the gossip router for the agent id; nil means a real
	// mesh router on MeshAddr.
	NewRouter func(id string) (Router, error)
	Logger    *slog.Logger

	// TLS names the CA, the agent's certificate (role agent, named after the
	// agent id) and its key: the HTTP API serves TLS with them and requires
	// client certificates of the CA, and the masters are reached over https
	// and must show a master certificate of the CA. Without ID, the agent id
	// is the certificate's.
	TLS pki.Files
	// MeshPassword turns on mesh's authenticated encryption; ring gossip
	// rides the same router. nil means none (an empty non-nil password would
	// encrypt with an empty secret).
	MeshPassword []byte
	// Insecure allows running without TLS files, without MeshPassword and
	// with plain http masters: for a throwaway lab only. New refuses each of
	// them otherwise (ErrInsecure).
	Insecure bool
	// SigningKey is the masters' public record-signing key
	// (--signing-pub-file): records and tombstones verify with it, and a
	// master state carrying another key is refused. nil: the key of the
	// first master state read, pinned in the store (see trust.go).
	SigningKey ed25519.PublicKey
}

// Agent is a running agent.
type Agent struct {
	cfg      Config
	sec      *security
	log      *slog.Logger
	id       string
	ip       netip.Addr
	store    *Store
	client   *api.Client
	router   Router
	channel  gossip.Channel
	dp       *vxlan.Dataplane
	members  *Membership
	registry *prometheus.Registry
	metrics  *metrics
	httpLn   net.Listener
	debugLn  net.Listener // nil without Config.DebugAddr
	ipam     ipamService
	ipamLn   net.Listener
	docker   *dockeripam.Service

	// onRebuild is the IPAM's rebuild hook: called with the new cluster id
	// once a rebuild of the masters' cluster has reset the membership
	// (nil: nothing to tell).
	onRebuild func(clusterID string)

	mu      sync.RWMutex
	self    *api.AgentInfo
	network *api.NetworkConfig
	// masterIndex and clusterID place the last master state applied: only
	// a state of another cluster is a rebuild, and a state of this one
	// below masterIndex is from a master that is behind.
	masterIndex uint64
	clusterID   string
	// mergedIndex is the masters' state index whose records and tombstones
	// the membership holds (set after the merge, unlike masterIndex): what
	// the IPAM's usage reports acknowledge.
	mergedIndex uint64
	// signingKey verifies records and tombstones: Config.SigningKey, or
	// the key pinned from the masters' state; nil while none is known.
	signingKey       ed25519.PublicKey
	staleWarned      bool // a stale master was logged at warning level since the last good state
	keyWarned        bool // a state refused for its key was logged as an error since the last good state
	unsignedWarned   bool // masters that sign nothing were logged once
	refusals         *logLimiter
	mastersReachable bool
	registered       bool
	lastReport       *vxlan.Report
	lastErr          error
	reconciledSelf   uint64               // self.Version covered by the last successful reconcile
	attemptedSelf    uint64               // self.Version the last reconcile that reached the kernel was for
	programmed       map[string]uint64    // peer id -> version programmed in the kernel
	connected        map[string]string    // mesh address handed to the router -> agent id
	dialing          map[string]time.Time // chosen mesh peer not connected yet -> since when

	connectCh chan struct{}

	// reports is the configuration result reportLoop sends the masters.
	reports *reporter

	reconcileCh  chan struct{}
	persistCh    chan struct{}
	reregisterCh chan struct{}
}

// New opens the agent's store and dataplane and prepares its gossip channel.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = DefaultResyncInterval
	}
	if cfg.WatchWait <= 0 {
		cfg.WatchWait = DefaultWatchWait
	}
	if cfg.MeshPeers <= 0 {
		cfg.MeshPeers = DefaultMeshPeers
	}
	if cfg.DataDir == "" {
		return nil, errors.New("agent: --data-dir is required")
	}
	sec, err := checkSecurity(cfg)
	if err != nil {
		return nil, err
	}
	client, err := api.NewClient(cfg.Masters, sec.httpClient(cfg))
	if err != nil {
		return nil, fmt.Errorf("agent: --masters: %w", err)
	}
	a := &Agent{
		cfg: cfg, sec: sec, client: client, members: NewMembership(), registry: prometheus.NewRegistry(),
		programmed: map[string]uint64{}, connected: map[string]string{}, dialing: map[string]time.Time{}, refusals: newLogLimiter(time.Minute),
		reports:     newReporter(),
		connectCh:   make(chan struct{}, 1),
		reconcileCh: make(chan struct{}, 1), persistCh: make(chan struct{}, 1), reregisterCh: make(chan struct{}, 1),
	}
	// Gossip may arrive as soon as the router exists: metrics come first.
	a.metrics = newMetrics(a.registry)
	if a.ip = cfg.IP; !a.ip.IsValid() {
		if a.ip, err = underlayIP(client.Masters()[0]); err != nil {
			return nil, err
		}
	}
	if a.store, err = OpenStore(cfg.DataDir); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			a.closeResources()
		}
	}()
	if a.id, err = a.store.LoadOrCreateID(sec.id, sec.idFrom); err != nil {
		return nil, err
	}
	a.log = cfg.Logger.With("agent", a.id)
	if len(sec.insecure) > 0 {
		a.log.Warn("--insecure: the agent runs without " + strings.Join(sec.insecure, ", without ") + "; for a throwaway lab only")
	}
	p, err := a.store.Load()
	if err != nil {
		return nil, err
	}
	a.self, a.network, a.masterIndex, a.clusterID = p.Self, p.Network, p.MasterIndex, p.ClusterID
	a.signingKey = p.SigningKey
	if cfg.SigningKey != nil {
		if p.SigningKey != nil && !p.SigningKey.Equal(cfg.SigningKey) {
			a.log.Warn("--signing-pub-file replaces the signing key pinned in --data-dir", "pinned", keyFingerprint(p.SigningKey), "key", keyFingerprint(cfg.SigningKey))
		}
		a.signingKey = cfg.SigningKey
	}
	a.loadMembership(p)
	if a.self != nil {
		a.log.Info("loaded last known state", "version", a.self.Version, "peers", a.members.Len()-1,
			"master_index", a.masterIndex, "cluster_id", a.clusterID)
	}
	if cfg.MeshAddr == "" {
		a.cfg.MeshAddr = net.JoinHostPort(a.ip.String(), "6783")
	}
	// The IPAM exists before the router: ring gossip may arrive at once.
	// It grows through the masters (then the ring) and reports usage to them.
	source := cfg.BlockSource
	if source == nil && len(client.Masters()) > 0 {
		source = &masterBlocks{id: a.id, client: client}
	}
	svc, err := ipam.New(ipam.Config{AgentID: a.id, DB: a.store.DB(), CNICacheDir: cfg.CNICacheDir, Registerer: a.registry, Logger: a.log,
		Growth: ipam.GrowthConfig{Source: source, LowWater: cfg.GrowLowWater, IdleReturn: cfg.BlockIdleReturn,
			UsageInterval: cfg.UsageInterval, OnChange: func() { a.trigger(a.reconcileCh) }},
		Reclaim: cfg.Reclaim, OnSent: a.sentCounter(ipam.RingChannel)})
	if err != nil {
		return nil, err
	}
	a.ipam = svc
	a.onRebuild = svc.Rebuild
	if cfg.DockerBridge && cfg.DockerPluginSocket != "" {
		a.docker, err = dockeripam.New(svc, dockeripam.Options{
			PluginSocket: cfg.DockerPluginSocket, SocketGID: cfg.SocketGID, DockerHost: cfg.DockerHost, NetworkName: cfg.DockerNetworkName,
			Logger: a.log.With("component", "docker"),
			MTU:    func(string) int { return a.overlayMTU() },
		})
		if err != nil {
			return nil, fmt.Errorf("agent: docker plugin: %w", err)
		}
	}
	if a.router, err = a.newRouter(); err != nil {
		return nil, err
	}
	if a.channel, err = a.router.Channel(GossipChannel, (*gossipHandler)(a)); err != nil {
		return nil, fmt.Errorf("agent: gossip channel: %w", err)
	}
	rings, err := a.router.Channel(ipam.RingChannel, a.ipam.RingGossip())
	if err != nil {
		return nil, fmt.Errorf("agent: ring gossip channel: %w", err)
	}
	a.ipam.UseChannel(rings)
	if a.dp, err = vxlan.New(vxlan.Options{NetNS: cfg.NetNS, Logger: a.log}); err != nil {
		return nil, fmt.Errorf("agent: dataplane: %w", err)
	}
	if a.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("agent: listen on --http-addr %s: %w", cfg.HTTPAddr, err)
	}
	if cfg.DebugAddr != "" {
		if a.debugLn, err = net.Listen("tcp", cfg.DebugAddr); err != nil {
			return nil, fmt.Errorf("agent: listen on --debug-addr %s: %w", cfg.DebugAddr, err)
		}
	}
	if cfg.Socket != "" {
		if a.ipamLn, err = unixsock.Listen(cfg.Socket, cfg.SocketGID); err != nil {
			return nil, fmt.Errorf("agent: --socket %s: %w", cfg.Socket, err)
		}
	}
	ok = true
	return a, nil
}

func (a *Agent) newRouter() (Router, error) {
	if a.cfg.NewRouter != nil {
		return a.cfg.NewRouter(a.id)
	}
	host, port, err := net.SplitHostPort(a.cfg.MeshAddr)
	if err != nil {
		return nil, fmt.Errorf("agent: --mesh-addr %q: want HOST:PORT", a.cfg.MeshAddr)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("agent: --mesh-addr %q: bad port", a.cfg.MeshAddr)
	}
	r, err := gossip.NewMeshRouter(gossip.MeshConfig{ID: a.id, Host: host, Port: p, Password: a.cfg.MeshPassword, Logger: a.log,
		NoDiscovery:       true,
		OnPasswordRefused: a.metrics.meshRefused.Inc})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// underlayIP is the source address of the route towards the master: a UDP
// "connect" picks it without sending anything.
func underlayIP(masterURL string) (netip.Addr, error) {
	u, err := urlHostPort(masterURL)
	if err != nil {
		return netip.Addr{}, err
	}
	conn, err := net.Dial("udp", u)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("agent: find the underlay IP (route towards %s): %w; give --ip", u, err)
	}
	defer conn.Close()
	ap, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("agent: underlay IP: %w", err)
	}
	return ap.Addr().Unmap(), nil
}

// overlayMTU is the overlay MTU of the committed network configuration.
func (a *Agent) overlayMTU() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.network != nil && a.network.OverlayMTU > 0 {
		return a.network.OverlayMTU
	}
	return defaultOverlayMTU
}

// ID is the agent's id.
func (a *Agent) ID() string { return a.id }

// HTTPAddr is the address the HTTP API listens on.
func (a *Agent) HTTPAddr() string { return a.httpLn.Addr().String() }

// DebugAddr is the address the runtime profiles are served on ("" without
// Config.DebugAddr).
func (a *Agent) DebugAddr() string {
	if a.debugLn == nil {
		return ""
	}
	return a.debugLn.Addr().String()
}

// IPAM is the agent's container address service (New always makes an *ipam.Service).
func (a *Agent) IPAM() *ipam.Service { s, _ := a.ipam.(*ipam.Service); return s }

// Registry is the Prometheus registry served on /metrics.
func (a *Agent) Registry() *prometheus.Registry { return a.registry }

// Run runs the agent until ctx ends. The kernel state stays as it is when it
// returns, so containers keep talking while the agent restarts.
func (a *Agent) Run(ctx context.Context) error {
	defer a.closeResources()
	if err := a.router.Start(); err != nil {
		return fmt.Errorf("agent: start gossip on %s: %w", a.cfg.MeshAddr, err)
	}
	srv := httpapi.NewServer(a.routes(), httpapi.ServerOptions{TLS: a.sec.server,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)})
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("http server stopped", "err", err)
		}
	}()
	var debug *httpapi.Server
	if a.debugLn != nil {
		debug = httpapi.NewServer(debugRoutes(), httpapi.ServerOptions{WriteTimeout: debugWriteTimeout,
			ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := debug.Serve(a.debugLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("debug http server stopped", "err", err)
			}
		}()
		a.log.Warn("serving runtime profiles without authentication on --debug-addr", "debug_addr", a.debugLn.Addr().String())
	}
	run(a.reconcileLoop)
	run(a.persistLoop)
	run(a.registerLoop)
	run(a.watchLoop)
	run(a.gossipLoop)
	run(a.ipam.Run)
	run(a.reportLoop)
	run(a.connectLoop)
	if a.ipamLn != nil {
		run(func(ctx context.Context) { a.ipam.Serve(ctx, a.ipamLn) })
	}
	if a.docker != nil {
		// Docker is optional: a failure here is reported, never fatal.
		run(func(ctx context.Context) {
			if err := a.docker.Run(ctx); err != nil {
				a.log.Error("docker plugin stopped", "socket", a.cfg.DockerPluginSocket, "err", err)
			}
		})
	}
	a.log.Info("agent started", "ip", a.ip, "http_addr", a.HTTPAddr(), "https", a.sec.server != nil, "mesh_addr", a.cfg.MeshAddr,
		"mesh_encrypted", a.cfg.MeshPassword != nil, "masters", a.client.Masters())
	a.connectPeers()
	a.trigger(a.reconcileCh) // from the persisted state, before any master answers

	<-ctx.Done()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shut)
	if debug != nil {
		_ = debug.Close()
	}
	_ = a.router.Stop()
	wg.Wait()
	if err := a.store.Save(a.snapshot()); err != nil {
		a.log.Error("final save", "err", err)
	}
	a.log.Info("agent stopped; the kernel state is left in place")
	return nil
}

func (a *Agent) closeResources() {
	if a.httpLn != nil {
		a.httpLn.Close()
	}
	if a.ipamLn != nil {
		a.ipamLn.Close()
	}
	if a.debugLn != nil {
		a.debugLn.Close()
	}
	if a.dp != nil {
		a.dp.Close()
	}
	if a.store != nil {
		a.store.Close()
	}
}

// trigger signals a coalescing channel.
func (a *Agent) trigger(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// registerLoop registers, retrying with backoff, and again whenever the
// masters show this agent deleted.
func (a *Agent) registerLoop(ctx context.Context) {
	for {
		a.register(ctx)
		select {
		case <-ctx.Done():
			return
		case <-a.reregisterCh:
			a.log.Warn("the masters no longer have this agent: registering again")
		}
	}
}

func (a *Agent) register(ctx context.Context) {
	hostname := a.cfg.Hostname
	if hostname == "" {
		hostname, _ = os.Hostname()
	}
	req := api.RegisterRequest{
		AgentID: a.id, Hostname: hostname, IP: a.ip.String(), MeshAddr: a.cfg.MeshAddr,
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: a.cfg.MesosBridge, DockerBridge: a.cfg.DockerBridge},
		RequestID:     api.NewRequestID(),
	}
	b := retry.Backoff{First: firstRetry, Max: maxRetry}
	explained := false // a TLS mismatch was logged as an error
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		info, err := a.client.Register(rctx, req)
		cancel()
		if err == nil {
			a.metrics.registrations.WithLabelValues("ok").Inc()
			a.log.Info("registered", "version", info.Version, "overlays", len(info.Overlays))
			a.mu.Lock()
			a.registered = true
			a.mu.Unlock()
			a.updateSelf(info)
			return
		}
		a.metrics.registrations.WithLabelValues("error").Inc()
		wait := b.Next()
		if !api.IsRetryable(err) {
			// A definite answer ends this request: the masters may
			// remember its id and give the same answer to it for ever (a
			// registration that committed, then its agent was deleted, is
			// answered "deleted"). The next attempt is a new request.
			req.RequestID = api.NewRequestID()
			if !api.IsCode(err, api.CodeNotFound) {
				// A refusal (bad input, VTEP IPs exhausted) will not fix
				// itself quickly, but the operator may free space: keep
				// trying, slowly. "Not found" (deleted meanwhile) is
				// answered by registering again, at the usual pace.
				wait = maxRetry
			}
		}
		if why := explainMasterError(err, a.cfg.TLS); why != "" {
			// A TLS or scheme mismatch: retrying does not fix it, the
			// operator must. Said plainly, as an error the first time.
			level := slog.LevelWarn
			if !explained {
				level, explained = slog.LevelError, true
			}
			a.log.Log(ctx, level, "registration failed: "+why+"; working from the last known state", "err", err, "retry_in", maxRetry)
			if !retry.Sleep(ctx, maxRetry) {
				return
			}
			continue
		}
		a.log.Warn("registration failed; working from the last known state", "err", err, "retry_in", wait.Round(time.Millisecond))
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// updateSelf records a newer own record, from the masters. The agent
// programs itself from it (the masters are authenticated by TLS); it joins
// the membership, and is gossiped, only when it verifies as any other
// record must. A registration answer read before the first master state
// cannot be verified yet (no cluster id, maybe no key): the state, which
// carries the same record, brings it in.
func (a *Agent) updateSelf(info *api.AgentInfo) {
	rec := NewPeerRecord(info)
	a.mu.Lock()
	if a.self != nil && a.self.Version > info.Version {
		a.mu.Unlock()
		return
	}
	// The same record again (every watch wake-up brings it): nothing to
	// store, program or gossip.
	if a.self != nil && a.self.Version == info.Version && jsonEqual(a.self, info) && a.members.holds(&rec) {
		a.mu.Unlock()
		return
	}
	a.self = info
	tr := a.trustLocked()
	a.mu.Unlock()
	a.trigger(a.persistCh)
	a.trigger(a.reconcileCh)
	st := MembershipState{Records: []PeerRecord{rec}}
	in, refused := tr.admit(tr.clusterID, st, a.members)
	if len(refused) > 0 {
		if tr.clusterID == "" || (tr.required && tr.key == nil) {
			a.log.Debug("own record not gossiped until the first master state", "version", info.Version)
		} else {
			a.countRefused(a.metrics.masterRefused, "the masters' record of this agent", refused)
		}
		return
	}
	// Under the lock, as gossip: a rebuild in between must not let a record
	// of the old cluster into the new one's membership.
	a.mu.RLock()
	current := a.clusterID == tr.clusterID
	if current {
		a.members.MergeFromMasters(in)
	}
	a.mu.RUnlock()
	if current {
		a.channel.Broadcast(a.gossipData(st))
	}
}

// watchLoop follows the masters' state: one whole state first, then only
// what changes (GET /overlay-master/changes), which costs a watcher what a
// change is, not what the cluster is. It reads the whole state again when
// the masters no longer keep the changes since its index (410: it was away
// longer than the change log or the tombstone horizon reach), when the
// cluster id changes (a rebuild), or when a master has no changes route
// (an older version).
func (a *Agent) watchLoop(ctx context.Context) {
	b := retry.Backoff{First: firstRetry, Max: maxWatchRetry}
	full := true
	for ctx.Err() == nil {
		a.mu.RLock()
		index, cluster := a.masterIndex, a.clusterID
		a.mu.RUnlock()
		var err error
		applied := false
		if full {
			var st *api.State
			st, err = a.client.State(ctx, api.StateOptions{Index: index, Wait: a.cfg.WatchWait})
			if err == nil {
				a.metrics.masterReads.WithLabelValues("state").Inc()
				applied = a.applyMasterState(st, true)
				full = !applied
			}
		} else {
			var ch *api.Changes
			ch, err = a.client.Changes(ctx, index, a.cfg.WatchWait)
			switch {
			case api.IsCode(err, api.CodeGone), api.IsCode(err, api.CodeNotFound):
				a.metrics.masterReads.WithLabelValues("gone").Inc()
				a.log.Info("reading the whole state: the masters do not serve the changes since this agent's index", "index", index, "err", err)
				full = true
				continue
			case err == nil && ch.ClusterID != cluster:
				a.log.Info("the changes are of another cluster: reading the whole state", "cluster_id", ch.ClusterID, "was", cluster)
				full = true
				continue
			case err == nil:
				a.metrics.masterReads.WithLabelValues("changes").Inc()
				applied = a.applyMasterState(changesState(ch), false)
			}
		}
		if applied {
			b.Reset()
			a.setReachable(true)
			continue
		}
		// A stale master counts as none: gossip and the disk are better.
		a.setReachable(false)
		wait := b.Next()
		if err != nil {
			a.log.Debug("state watch failed", "err", err, "retry_in", wait)
		}
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// changesState is a changes answer as a (partial) state: without a
// network configuration when it did not change (networkFrom keeps the
// known one).
func changesState(ch *api.Changes) *api.State {
	st := &api.State{Index: ch.Index, ClusterID: ch.ClusterID, SigningKey: ch.SigningKey, Horizon: ch.Horizon,
		Agents: ch.Agents, Tombstones: ch.Tombstones}
	if ch.Network != nil {
		st.Network = *ch.Network
	}
	return st
}

func (a *Agent) setReachable(ok bool) {
	a.mu.Lock()
	a.mastersReachable = ok
	a.mu.Unlock()
	v := 0.0
	if ok {
		v = 1
	}
	a.metrics.mastersReachable.Set(v)
}

// stateVerdict is what a state read from a master means to an agent.
type stateVerdict int

const (
	// stateCurrent: the agent's cluster, at or past what the agent saw.
	stateCurrent stateVerdict = iota
	// stateStale: a master of the agent's cluster that is behind what the
	// agent saw (restarted alone, cut off from the others): ignored.
	stateStale
	// stateRebuilt: another cluster; the masters were rebuilt from nothing.
	stateRebuilt
)

// judgeState tells what st means to an agent that last applied index of
// cluster clusterID. Only a cluster id that differs from a known one proves
// a rebuild. A lower index without that proof, from masters with or
// without cluster ids, is a master that is behind: taking its state would
// take back what the agent knows, peers and leases alike.
func judgeState(clusterID string, index uint64, st *api.State) stateVerdict {
	switch {
	case clusterID != "" && st.ClusterID != "" && st.ClusterID != clusterID:
		return stateRebuilt
	case st.Index < index:
		return stateStale
	}
	return stateCurrent
}

// networkFrom is the network configuration to hold after a master's state
// with configuration st, and whether it changed: st, except that an empty
// configuration never replaces a known one (a rebuilt cluster, which may
// have none yet, resets cur to nil first).
func networkFrom(cur *api.NetworkConfig, st api.NetworkConfig) (*api.NetworkConfig, bool) {
	if cur != nil && (jsonEqual(*cur, st) || reflect.ValueOf(st).IsZero()) {
		return cur, false
	}
	return &st, true
}

// applyMasterState merges a state read from the masters, whole (full) or
// the changes since the agent's index; false means it was ignored (a stale
// master, or a state whose signing key is refused). Only a whole state
// drops the records the masters no longer hold (at or below their
// compaction horizon: see Membership.SyncWithMasters); changes hold only
// what changed.
func (a *Agent) applyMasterState(st *api.State, full bool) bool {
	a.mu.Lock()
	verdict := judgeState(a.clusterID, a.masterIndex, st)
	if verdict == stateStale {
		seen, warned := a.masterIndex, a.staleWarned
		a.staleWarned = true
		a.mu.Unlock()
		a.metrics.staleStates.Inc()
		level := slog.LevelWarn
		if warned {
			level = slog.LevelDebug
		}
		a.log.Log(context.Background(), level, "ignoring the state of a master that is behind: keeping the last known state",
			"index", st.Index, "seen", seen, "cluster_id", st.ClusterID)
		return false
	}
	key, err := keyAfter(a.cfg.SigningKey, a.signingKey, st, verdict == stateRebuilt, a.sec.client == nil)
	if err != nil {
		warned := a.keyWarned
		a.keyWarned = true
		a.mu.Unlock()
		reason := stateRefusedKey
		if errors.Is(err, errStateUnsigned) {
			reason = stateRefusedUnsigned
		}
		a.metrics.statesRefused.WithLabelValues(reason).Inc()
		// The operator must act: said as an error the first time, then
		// quietly while the masters keep answering so.
		level := slog.LevelError
		if warned {
			level = slog.LevelDebug
		}
		a.log.Log(context.Background(), level, err.Error()+"; keeping the last known state", "index", st.Index, "cluster_id", st.ClusterID)
		return false
	}
	a.staleWarned, a.keyWarned = false, false
	pinned := key != nil && !key.Equal(a.signingKey)
	warnUnsigned := key == nil && !a.unsignedWarned
	if key == nil {
		a.unsignedWarned = true
	}
	oldCluster, oldKey := a.clusterID, a.signingKey
	a.signingKey = key
	if verdict == stateRebuilt {
		// Records, tombstones and versions of the old cluster mean nothing
		// in the new one; its state is the truth now.
		a.members.Reset()
		a.self, a.network = nil, nil
		a.trigger(a.reregisterCh)
	}
	if st.ClusterID != "" {
		a.clusterID = st.ClusterID
	}
	indexChanged := a.masterIndex != st.Index || oldCluster != a.clusterID
	a.masterIndex = st.Index
	var netChanged bool
	a.network, netChanged = networkFrom(a.network, st.Network)
	registered := a.registered
	tr := a.trustLocked()
	a.mu.Unlock()

	if verdict == stateRebuilt {
		a.metrics.rebuilds.Inc()
		a.log.Warn("the masters' cluster was rebuilt: dropped the old cluster's membership; registering again",
			"old_cluster_id", oldCluster, "cluster_id", st.ClusterID, "index", st.Index)
		if a.onRebuild != nil {
			a.onRebuild(st.ClusterID)
		}
	}
	switch {
	case pinned && oldKey != nil:
		a.log.Warn("the rebuilt cluster signs with a new key: verifying with it", "key", keyFingerprint(key), "old_key", keyFingerprint(oldKey), "cluster_id", st.ClusterID)
	case pinned:
		a.log.Info("verifying records with the masters' signing key, pinned from their state", "key", keyFingerprint(key), "cluster_id", st.ClusterID)
	case warnUnsigned:
		a.log.Warn("--insecure: the masters sign nothing; gossip is accepted without signature verification (range checks only)", "cluster_id", st.ClusterID)
	}
	in := MembershipState{Tombstones: st.Tombstones}
	var mine *api.AgentInfo
	for i := range st.Agents {
		in.Records = append(in.Records, NewPeerRecord(&st.Agents[i]))
		if st.Agents[i].AgentID == a.id {
			mine = &st.Agents[i]
		}
	}
	in, refused := tr.admit(st.ClusterID, in, a.members)
	a.countRefused(a.metrics.masterRefused, "the masters' state", refused)
	news := a.members.MergeFromMasters(in)
	var dropped []string
	if full {
		held := make(map[string]bool, len(st.Agents))
		for i := range st.Agents {
			held[st.Agents[i].AgentID] = true
		}
		if dropped = a.members.SyncWithMasters(held, st.Horizon); len(dropped) > 0 {
			a.log.Info("dropped peers the masters deleted before their compaction horizon", "peers", len(dropped), "horizon", st.Horizon)
		}
	} else {
		a.members.Compact(st.Horizon)
	}
	if mine != nil {
		a.updateSelf(mine)
	} else if tv, gone := a.members.Tombstone(a.id); gone && registered {
		a.mu.RLock()
		stale := a.self != nil && a.self.Version <= tv
		a.mu.RUnlock()
		if stale {
			a.trigger(a.reregisterCh)
		}
	}
	a.mu.Lock()
	if verdict == stateRebuilt || st.Index > a.mergedIndex {
		a.mergedIndex = st.Index
	}
	a.mu.Unlock()
	changed := len(news.Records)+len(news.Tombstones)+len(dropped) > 0 || netChanged
	if changed || indexChanged || pinned || verdict == stateRebuilt {
		a.trigger(a.persistCh)
	}
	if changed {
		a.trigger(a.reconcileCh)
		a.trigger(a.connectCh)
		a.channel.Broadcast(a.gossipData(news))
	}
	return true
}

// trustLocked is what records are checked against now (a.mu held). With
// TLS to the masters, or once a key is known, signatures are required;
// only --insecure with plain http masters that sign nothing goes without.
func (a *Agent) trustLocked() trust {
	return trust{clusterID: a.clusterID, key: a.signingKey, required: a.signingKey != nil || a.sec.client != nil, network: a.network}
}

// loadMembership merges the persisted membership, checked as gossip is:
// the store holds what was verified, unless it was written by a version
// of the agent that kept no signatures, or with another key.
func (a *Agent) loadMembership(p persisted) {
	tr := a.trustLocked()
	if tr.clusterID == "" {
		tr.required = false // nothing of a cluster yet; nothing persisted either
	}
	in, refused := tr.admit(tr.clusterID, p.Membership, a.members)
	if len(refused) > 0 {
		a.log.Warn("dropped persisted records that do not pass the checks; the masters or gossip will bring them again",
			"dropped", len(refused), "first", refused[0].err)
	}
	masters := map[string]bool{}
	for _, id := range p.FromMasters {
		masters[id] = true
	}
	var fromMasters, other MembershipState
	fromMasters.Tombstones = in.Tombstones
	for _, r := range in.Records {
		if masters[r.ID] {
			fromMasters.Records = append(fromMasters.Records, r)
		} else {
			other.Records = append(other.Records, r)
		}
	}
	a.members.Compact(p.Horizon)
	a.members.MergeFromMasters(fromMasters)
	a.members.Merge(other)
}

// countRefused counts refused records and tombstones and logs them, at
// most once a minute per reason and source.
func (a *Agent) countRefused(counter *prometheus.CounterVec, source string, refused []refusal) {
	for _, r := range refused {
		counter.WithLabelValues(r.reason).Inc()
		level := slog.LevelDebug
		if a.refusals.allow(source + "/" + r.reason) {
			level = slog.LevelWarn
		}
		a.log.Log(context.Background(), level, "refused a record or tombstone of "+source, "reason", r.reason, "err", r.err)
	}
}

// persistLoop writes the state whenever it changed (coalesced).
func (a *Agent) persistLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.persistCh:
			if err := a.store.Save(a.snapshot()); err != nil {
				a.log.Error("persist agent state", "err", err)
			}
		}
	}
}

func (a *Agent) snapshot() persisted {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return persisted{ID: a.id, Self: a.self, Network: a.network, Membership: a.members.State(),
		MasterIndex: a.masterIndex, ClusterID: a.clusterID, SigningKey: a.signingKey, FromMasters: a.members.FromMasters(),
		Horizon: a.members.Horizon()}
}

// gossipData is a membership delta as this agent gossips it, with its cluster.
func (a *Agent) gossipData(st MembershipState) membershipData {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return membershipData{clusterID: a.clusterID, st: st, sent: a.sentCounter(GossipChannel)}
}

// digestData is this agent's anti-entropy digest as gossip data.
func (a *Agent) digestData() membershipData {
	a.mu.RLock()
	cid := a.clusterID
	a.mu.RUnlock()
	return membershipData{clusterID: cid, from: a.id, digest: a.members.Digest(0), sent: a.sentCounter(GossipChannel)}
}

// sentCounter counts the bytes sent on a channel, by kind.
func (a *Agent) sentCounter(channel string) func(kind string, n int) {
	return func(kind string, n int) { a.metrics.gossipSent.WithLabelValues(channel, kind).Add(float64(n)) }
}

// gossipLoop gossips the membership's digest now and then (mesh also
// gossips it periodically, and to every new neighbour), and keeps the
// mesh connections to a bounded set of peers.
func (a *Agent) gossipLoop(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.channel.Gossip(a.digestData())
			a.connectPeers()
			a.metrics.gossipPeers.Set(float64(len(a.router.Peers())))
		}
	}
}

// connectLoop keeps the mesh connections (connectPeers) whenever the
// membership changed (coalesced).
func (a *Agent) connectLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.connectCh:
			a.connectPeers()
		}
	}
}

// connectPeers keeps the router connected to a bounded set of peers
// (Config.MeshPeers): mesh routes broadcasts along a spanning tree of its
// topology and unicasts through neighbours, so it needs no full mesh. The
// set is chosen by rendezvous hashing of this agent's id with each peer's
// (pickMeshPeers): deterministic, spread evenly, and stable as agents come
// and go; a chosen peer that does not connect for a while is replaced by
// the next. Addresses the router no longer needs are forgotten (a deleted
// agent's, the old one of an agent that moved, one that left the set):
// mesh retries every address it was given for ever. While the membership
// names no peer at all (reset by a rebuild), the addresses are kept.
func (a *Agent) connectPeers() {
	cands, known := a.members.meshCandidates(a.id)
	var connected map[string]bool
	if n, ok := a.router.(neighbourer); ok {
		connected = map[string]bool{}
		for _, id := range n.Neighbours() {
			connected[id] = true
		}
	}
	now := time.Now()
	a.mu.Lock()
	chosen := pickMeshPeers(a.id, cands, a.cfg.MeshPeers, func(id string) bool {
		if connected == nil || connected[id] {
			delete(a.dialing, id)
			return true
		}
		since, ok := a.dialing[id]
		if !ok {
			a.dialing[id] = now
			return true
		}
		return now.Sub(since) < meshDialGrace
	})
	want := map[string]string{} // mesh address -> agent id
	for _, c := range chosen {
		want[c.addr] = c.id
	}
	for id := range a.dialing {
		if !slices.ContainsFunc(chosen, func(c meshCandidate) bool { return c.id == id }) && !slices.ContainsFunc(cands, func(c meshCandidate) bool { return c.id == id }) {
			delete(a.dialing, id)
		}
	}
	var connect, forget []string
	for addr, id := range a.connected {
		if _, ok := want[addr]; !ok && (known[id] || len(cands) > 0) {
			forget = append(forget, addr)
			delete(a.connected, addr)
		}
	}
	for addr, id := range want {
		if _, ok := a.connected[addr]; !ok {
			connect = append(connect, addr)
		}
		a.connected[addr] = id
	}
	a.mu.Unlock()
	a.metrics.meshTargets.Set(float64(len(want)))
	if len(forget) > 0 {
		slices.Sort(forget)
		a.log.Debug("forgetting mesh peers", "addrs", forget)
		if err := a.router.Forget(forget...); err != nil {
			a.log.Warn("forget mesh peers", "err", err)
		}
	}
	if len(connect) > 0 {
		slices.Sort(connect)
		if err := a.router.Connect(connect...); err != nil {
			a.log.Warn("connect to mesh peers", "err", err)
		}
	}
}

// gossipHandler receives membership gossip: deltas (broadcast and relayed
// gossip), digests (periodic gossip), and the unicast answers of
// anti-entropy (see antientropy.go).
type gossipHandler Agent

func (h *gossipHandler) Gossip() gossip.Data { return (*Agent)(h).digestData() }

// receive handles one message; src is the sender of a unicast ("" for
// broadcast and gossip, where a digest names its sender).
func (h *gossipHandler) receive(src string, msg []byte) (gossip.Data, error) {
	a := (*Agent)(h)
	m, err := DecodeMembership(msg)
	if err != nil {
		a.metrics.gossip.WithLabelValues("bad").Inc()
		return nil, err
	}
	a.answer(src, &m)
	if len(m.Records)+len(m.Tombstones) == 0 {
		return nil, nil
	}
	news, tr, current := a.mergeGossip(m)
	if !current || len(news.Records)+len(news.Tombstones) == 0 {
		return nil, nil
	}
	return membershipData{clusterID: tr.clusterID, st: news, sent: a.sentCounter(GossipChannel)}, nil
}

// mergeGossip checks and merges the records and tombstones of a message and
// returns what was news; current is false when a rebuild came in between.
func (a *Agent) mergeGossip(m MembershipMessage) (news MembershipState, tr trust, current bool) {
	a.mu.RLock()
	tr = a.trustLocked()
	a.mu.RUnlock()
	// Signatures are checked outside the lock; the merge happens under it,
	// only if the cluster and the key are still those checked against, so
	// that a rebuild's reset cannot come between and let old records in.
	in, refused := tr.admit(m.ClusterID, m.MembershipState, a.members)
	a.mu.RLock()
	current = a.clusterID == tr.clusterID && a.signingKey.Equal(tr.key)
	if current {
		news = a.members.Merge(in)
	}
	a.mu.RUnlock()
	if tr.clusterID == "" {
		// Agents that start together hear one another before their first
		// master state: counted, but nothing to warn about.
		for _, r := range refused {
			a.metrics.gossipRefused.WithLabelValues(r.reason).Inc()
			a.log.Debug("refused gossip before the first master state", "reason", r.reason, "err", r.err)
		}
	} else {
		a.countRefused(a.metrics.gossipRefused, "gossip", refused)
	}
	switch {
	case !current:
		return news, tr, false // the next gossip is checked against the new cluster or key
	case len(in.Records)+len(in.Tombstones) == 0 && len(refused) > 0:
		a.metrics.gossip.WithLabelValues("refused").Inc()
		return news, tr, true
	case len(news.Records)+len(news.Tombstones) == 0:
		a.metrics.gossip.WithLabelValues("known").Inc()
		return news, tr, true
	}
	a.metrics.gossip.WithLabelValues("news").Inc()
	for _, r := range news.Records {
		if r.ID == a.id {
			continue
		}
		a.log.Debug("learned from gossip", "peer", r.ID, "version", r.Version)
	}
	a.trigger(a.persistCh)
	a.trigger(a.reconcileCh)
	a.trigger(a.connectCh)
	return news, tr, true
}

// answer handles the anti-entropy parts of a message: a digest is answered
// with a summary of the buckets that differ, a summary with a push of what
// the other lacks and a want list, a want list with a push. Only messages
// of this agent's cluster are answered.
func (a *Agent) answer(src string, m *MembershipMessage) {
	if m.Digest == nil && m.Summary == nil && len(m.Want) == 0 {
		return
	}
	a.mu.RLock()
	cid := a.clusterID
	a.mu.RUnlock()
	if m.ClusterID != cid {
		a.metrics.antiEntropy.WithLabelValues("other_cluster").Inc()
		return
	}
	if m.Digest != nil && m.From != a.id {
		a.metrics.antiEntropy.WithLabelValues("digest").Inc()
		if sum := a.members.AnswerDigest(m.Digest); sum != nil {
			a.unicast(m.From, "summary", MembershipMessage{ClusterID: cid, Summary: sum})
		}
	}
	if src == "" {
		return // summaries and want lists come by unicast only
	}
	if m.Summary != nil {
		a.metrics.antiEntropy.WithLabelValues("summary").Inc()
		push, want := a.members.AnswerSummary(m.Summary)
		a.push(src, cid, push)
		if len(want) > 0 {
			a.unicast(src, "want", MembershipMessage{ClusterID: cid, Want: want})
		}
	}
	if len(m.Want) > 0 {
		a.metrics.antiEntropy.WithLabelValues("want").Inc()
		a.push(src, cid, a.members.Lookup(m.Want))
	}
}

// push unicasts records and tombstones, in bounded messages.
func (a *Agent) push(dst, cid string, st MembershipState) {
	for _, c := range chunks(st) {
		a.unicast(dst, "push", MembershipMessage{ClusterID: cid, MembershipState: c})
	}
}

func (a *Agent) unicast(dst, kind string, msg MembershipMessage) {
	b := encodeMessage(msg)
	if err := a.channel.Unicast(dst, b); err != nil {
		a.log.Debug("anti-entropy unicast", "to", dst, "kind", kind, "err", err)
		return
	}
	a.metrics.gossipSent.WithLabelValues(GossipChannel, kind).Add(float64(len(b)))
}

func (h *gossipHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive("", msg) }

func (h *gossipHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return h.receive("", msg)
}

// OnUnicast receives anti-entropy answers; what a push brings is merged
// and not relayed (every peer runs its own anti-entropy).
func (h *gossipHandler) OnUnicast(src string, msg []byte) error {
	_, err := h.receive(src, msg)
	return err
}
