// Package agent is the carve agent daemon: it registers with the masters,
// learns every other agent from the masters' state watch and from mesh
// gossip (merged by record version, with tombstones), keeps its last known
// state on disk so that it works while no master answers, and reconciles its
// kernel (package vxlan) to the desired dataplane on every change and on a
// periodic full resync.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/unixsock"
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
	Connect(addrs ...string) error
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
	// Socket is the unix socket of the IPAM service.
	Socket string
	// CNIConfDir receives a <overlay>.conflist per overlay with a mesos
	// bridge; empty writes none.
	CNIConfDir string
	// DockerPluginSocket is where the Docker remote IPAM plugin listens (with
	// DockerBridge); empty disables the plugin.
	DockerPluginSocket string
	// DockerHost is the Docker engine the agent creates its networks on.
	DockerHost string
	// CNICacheDir is the runtime's libcni cache (results/), read to take
	// back the addresses of running containers after a lost disk; empty: none.
	CNICacheDir string
	// MeshAddr is where mesh listens (HOST:PORT); it is advertised to other
	// agents through the masters. Empty means IP:6783.
	MeshAddr     string
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
}

// Agent is a running agent.
type Agent struct {
	cfg      Config
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
	ipam     ipamService
	ipamLn   net.Listener
	docker   *dockeripam.Service

	mu               sync.RWMutex
	self             *api.AgentInfo
	network          *api.NetworkConfig
	masterIndex      uint64
	mastersReachable bool
	registered       bool
	lastReport       *vxlan.Report
	lastErr          error
	reconciledSelf   uint64            // self.Version covered by the last successful reconcile
	programmed       map[string]uint64 // peer id -> version programmed in the kernel
	connected        map[string]bool   // mesh addresses handed to the router

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
	if cfg.DataDir == "" {
		return nil, errors.New("agent: --data-dir is required")
	}
	client, err := api.NewClient(cfg.Masters, &http.Client{Timeout: cfg.WatchWait + 15*time.Second})
	if err != nil {
		return nil, fmt.Errorf("agent: --masters: %w", err)
	}
	a := &Agent{
		cfg: cfg, client: client, members: NewMembership(), registry: prometheus.NewRegistry(),
		programmed: map[string]uint64{}, connected: map[string]bool{},
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
	if a.id, err = a.store.LoadOrCreateID(cfg.ID); err != nil {
		return nil, err
	}
	a.log = cfg.Logger.With("agent", a.id)
	p, err := a.store.Load()
	if err != nil {
		return nil, err
	}
	a.self, a.network, a.masterIndex = p.Self, p.Network, p.MasterIndex
	a.members.Merge(p.Membership)
	if a.self != nil {
		a.log.Info("loaded last known state", "version", a.self.Version, "peers", a.members.Len()-1, "master_index", a.masterIndex)
	}
	if cfg.MeshAddr == "" {
		a.cfg.MeshAddr = net.JoinHostPort(a.ip.String(), "6783")
	}
	// The IPAM exists before the router: ring gossip may arrive at once.
	svc, err := ipam.New(ipam.Config{AgentID: a.id, DB: a.store.DB(), CNICacheDir: cfg.CNICacheDir, Registerer: a.registry, Logger: a.log})
	if err != nil {
		return nil, err
	}
	a.ipam = svc
	if cfg.DockerBridge && cfg.DockerPluginSocket != "" {
		a.docker, err = dockeripam.New(svc, dockeripam.Options{
			PluginSocket: cfg.DockerPluginSocket, DockerHost: cfg.DockerHost, Logger: a.log.With("component", "docker"),
			MTU: func(string) int { return a.overlayMTU() },
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
	if cfg.Socket != "" {
		if a.ipamLn, err = unixsock.Listen(cfg.Socket); err != nil {
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
	r, err := gossip.NewMeshRouter(gossip.MeshConfig{ID: a.id, Host: host, Port: p, Logger: a.log})
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
	srv := &http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}
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
	run(a.reconcileLoop)
	run(a.persistLoop)
	run(a.registerLoop)
	run(a.watchLoop)
	run(a.gossipLoop)
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
	a.log.Info("agent started", "ip", a.ip, "http_addr", a.HTTPAddr(), "mesh_addr", a.cfg.MeshAddr, "masters", a.client.Masters())
	a.connectPeers()
	a.trigger(a.reconcileCh) // from the persisted state, before any master answers

	<-ctx.Done()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shut)
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

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff is jittered exponential: d doubles up to maxRetry, and the wait is
// drawn from [d/2, d] so that agents restarted together do not retry together.
func backoff(d time.Duration) (wait, next time.Duration) {
	wait = d/2 + rand.N(d/2+1)
	return wait, min(d*2, maxRetry)
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
	delay := firstRetry
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
		var wait time.Duration
		wait, delay = backoff(delay)
		if !api.IsRetryable(err) {
			// A refusal (bad input, VTEP IPs exhausted) will not fix itself
			// quickly, but the operator may free space: keep trying, slowly.
			wait = maxRetry
		}
		a.log.Warn("registration failed; working from the last known state", "err", err, "retry_in", wait.Round(time.Millisecond))
		if !sleep(ctx, wait) {
			return
		}
	}
}

// updateSelf records a newer own record.
func (a *Agent) updateSelf(info *api.AgentInfo) {
	a.mu.Lock()
	if a.self != nil && a.self.Version > info.Version {
		a.mu.Unlock()
		return
	}
	a.self = info
	a.mu.Unlock()
	a.members.Merge(MembershipState{Records: []PeerRecord{peerFromInfo(info)}})
	a.trigger(a.persistCh)
	a.trigger(a.reconcileCh)
	a.channel.Broadcast(membershipData{st: MembershipState{Records: []PeerRecord{peerFromInfo(info)}}})
}

// watchLoop follows the masters' state with blocking queries.
func (a *Agent) watchLoop(ctx context.Context) {
	delay := firstRetry
	for ctx.Err() == nil {
		a.mu.RLock()
		index := a.masterIndex
		a.mu.RUnlock()
		st, err := a.client.State(ctx, api.StateOptions{Index: index, Wait: a.cfg.WatchWait})
		if err != nil {
			a.setReachable(false)
			var wait time.Duration
			wait, delay = backoff(delay)
			delay = min(delay, maxWatchRetry)
			a.log.Debug("state watch failed", "err", err, "retry_in", wait)
			if !sleep(ctx, wait) {
				return
			}
			continue
		}
		delay = firstRetry
		a.setReachable(true)
		a.applyMasterState(st)
	}
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

// applyMasterState merges a state read from the masters.
func (a *Agent) applyMasterState(st *api.State) {
	in := MembershipState{Tombstones: st.Tombstones}
	var mine *api.AgentInfo
	for i := range st.Agents {
		in.Records = append(in.Records, peerFromInfo(&st.Agents[i]))
		if st.Agents[i].AgentID == a.id {
			mine = &st.Agents[i]
		}
	}
	a.mu.Lock()
	if st.Index < a.masterIndex {
		// The masters' log is younger than what we saw: a rebuilt cluster.
		// Their state is the truth now; versions from the old log mean nothing.
		a.log.Warn("the masters' state index went back: taking their state as it is", "was", a.masterIndex, "now", st.Index)
		a.members.Reset()
		a.self = nil
		a.trigger(a.reregisterCh)
	}
	a.masterIndex = st.Index
	netChanged := a.network == nil || !jsonEqual(*a.network, st.Network)
	if netChanged {
		cfg := st.Network
		a.network = &cfg
	}
	registered := a.registered
	a.mu.Unlock()

	news := a.members.Merge(in)
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
	a.trigger(a.persistCh)
	if len(news.Records)+len(news.Tombstones) > 0 || netChanged {
		a.trigger(a.reconcileCh)
		a.connectPeers()
		a.channel.Broadcast(membershipData{st: news})
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
	return persisted{ID: a.id, Self: a.self, Network: a.network, Membership: a.members.State(), MasterIndex: a.masterIndex}
}

// gossipLoop pushes the whole membership now and then (mesh also gossips it
// periodically; this covers peers that joined since the last change).
func (a *Agent) gossipLoop(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.channel.Gossip(membershipData{st: a.members.State()})
			a.connectPeers()
			a.metrics.gossipPeers.Set(float64(len(a.router.Peers())))
		}
	}
}

// connectPeers hands the router the mesh addresses of agents it has not
// been given yet.
func (a *Agent) connectPeers() {
	st := a.members.State()
	var addrs []string
	a.mu.Lock()
	for _, r := range st.Records {
		if r.ID == a.id || r.MeshAddr == "" || a.connected[r.MeshAddr] {
			continue
		}
		a.connected[r.MeshAddr] = true
		addrs = append(addrs, r.MeshAddr)
	}
	a.mu.Unlock()
	if len(addrs) == 0 {
		return
	}
	slices.Sort(addrs)
	if err := a.router.Connect(addrs...); err != nil {
		a.log.Warn("connect to mesh peers", "err", err)
	}
}

// gossipHandler receives membership gossip.
type gossipHandler Agent

func (h *gossipHandler) Gossip() gossip.Data {
	return membershipData{st: (*Agent)(h).members.State()}
}

func (h *gossipHandler) merge(msg []byte) (gossip.Data, error) {
	a := (*Agent)(h)
	st, err := DecodeMembership(msg)
	if err != nil {
		a.metrics.gossip.WithLabelValues("bad").Inc()
		return nil, err
	}
	news := a.members.Merge(st)
	if len(news.Records)+len(news.Tombstones) == 0 {
		a.metrics.gossip.WithLabelValues("known").Inc()
		return nil, nil
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
	a.connectPeers()
	return membershipData{st: news}, nil
}

func (h *gossipHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.merge(msg) }

func (h *gossipHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) { return h.merge(msg) }

func (h *gossipHandler) OnUnicast(src string, _ []byte) error {
	return fmt.Errorf("unexpected unicast from %s on %s", src, GossipChannel)
}
