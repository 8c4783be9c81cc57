// Package agent is the carve agent daemon: it registers with the masters,
// learns every other agent from the masters' state watch and from mesh
// gossip into its membership (package membership: merged by record
// version, with tombstones), keeps its last known state on disk (package
// store) so that it works while no master answers, and reconciles its
// kernel (package kernel, through package vxlan) to the desired dataplane
// on every change and on a periodic full resync.
//
// This file wires the agent and runs it; the other files are its jobs:
// config.go (its configuration), register.go (registration), watch.go (the
// masters' state), gossip.go and meshpeers.go (membership gossip and the
// mesh connections), verify.go and restore.go (the signing key, refusals,
// the history before a restore), persist.go (what is saved, and when),
// reconcile.go and report.go (the reconcile loop around package kernel,
// and what the masters are told of it), cniconf.go (the CNI conflists),
// ipam*.go and growth.go (the address service's side), wireguard.go
// (encryption between hosts as the agent serves it: the routes, rotation
// through its registration; package encryption holds the keys, which
// peers go through WireGuard and the device),
// server.go, security.go, rotate.go, debug.go and metrics.go (the HTTP
// API, TLS, rotation without a restart, profiles and metrics).
package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/agent/encryption"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/agent/kernel"
	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/agent/meshpeers"
	"github.com/carve-net/carve/agent/report"
	"github.com/carve-net/carve/agent/store"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/firewall"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/certmetrics"
	"github.com/carve-net/carve/internal/goroutines"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/unixsock"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/vxlan"
)

// GossipChannel is the mesh channel that carries agent records.
const GossipChannel = "carve-agents"

// Agent is a running agent.
type Agent struct {
	cfg    Config
	sec    *security
	log    *slog.Logger
	id     string
	ip     netip.Addr
	store  *store.Store
	client *apiclient.Client
	router Router
	// meshPeers are the peers the router is kept connected to.
	meshPeers *meshpeers.Set
	channel   gossip.Channel
	dp        *vxlan.Dataplane
	members   *membership.Membership
	registry  *prometheus.Registry
	// claimKey signs this agent's claims on address space (ring entries,
	// grants); its public half is registered (pki.ClaimKeyFile).
	claimKey ed25519.PrivateKey
	metrics  *metrics
	httpLn   net.Listener
	debugLn  net.Listener // nil without Config.DebugAddr
	ipam     ipamService
	ipamLn   net.Listener
	docker   *dockeripam.Service
	wg       *encryption.WireGuard // encryption between hosts (package encryption, wireguard.go)
	fw       *firewall.Forward
	// kernel programs the kernel through dp and fw (package kernel).
	kernel *kernel.Kernel

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
	// restoreEpoch is the restore epoch of the last master state applied
	// (api.Restore): a state of a lower epoch is from a master that missed
	// a restore, one of a higher epoch a restore to follow.
	restoreEpoch uint64
	// restoreFloor is the highest version the agent knew when it followed
	// the last restore: gossip at or below it that the agent does not hold
	// is of the history before the restore (restore.go).
	restoreFloor uint64
	// mergedIndex is the masters' state index whose records and tombstones
	// the membership holds (set after the merge, unlike masterIndex): what
	// the IPAM's usage reports acknowledge.
	mergedIndex uint64
	// signingKey verifies records and tombstones: Config.SigningKey, or
	// the key pinned from the masters' state or followed through their
	// signing key chain; nil while none is known.
	signingKey ed25519.PublicKey
	// previousKeys still verify while the masters serve a chain that leads
	// from them to signingKey; stateKey is the signing key of the last
	// master state applied (a new one there: the whole state is read again,
	// re-signed).
	previousKeys     []ed25519.PublicKey
	stateKey         string
	staleWarned      bool // a stale master was logged at warning level since the last good state
	keyWarned        bool // a state refused for its key was logged as an error since the last good state
	unsignedWarned   bool // masters that sign nothing were logged once
	refusals         *logLimiter
	mastersReachable bool
	registered       bool
	lostIPAt         time.Time         // when the agent last registered again for a record without its IP
	revoked          map[string]uint64 // agents the masters revoked, from their state (membership.RevokedAgents)

	// refusing says why the agent refuses what the masters serve, "" when
	// it holds a verified state (verify.go, setRefusing); unverified are
	// the saved records it refused at start, programmed meanwhile.
	refusing   string
	unverified membership.State

	connectCh chan struct{}

	// reports is the configuration result reportLoop sends the masters.
	reports *report.Reporter

	// cniVersion is the spec version of the conflists, fixed once by the
	// reconcile loop before its first reconcile, and used by it only
	// (cniconf.go).
	cniVersion string

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
	if err := checkCNIConfig(cfg); err != nil {
		return nil, err
	}
	sec, err := checkSecurity(cfg)
	if err != nil {
		return nil, err
	}
	client, err := apiclient.NewClient(cfg.Masters, sec.httpClient(cfg))
	if err != nil {
		return nil, fmt.Errorf("agent: --masters: %w", err)
	}
	a := &Agent{
		cfg: cfg, sec: sec, client: client, members: membership.New(), registry: prometheus.NewRegistry(),
		refusals:    newLogLimiter(time.Minute),
		reports:     report.New(),
		connectCh:   make(chan struct{}, 1),
		reconcileCh: make(chan struct{}, 1), persistCh: make(chan struct{}, 1), reregisterCh: make(chan struct{}, 1),
	}
	a.reports.SetMesh(meshFingerprints(cfg.MeshPassword, cfg.MeshAcceptedPasswords))
	// Gossip may arrive as soon as the router exists: metrics come first.
	a.metrics = newMetrics(a.registry)
	if cfg.TLS.Enabled() {
		a.registry.MustRegister(certmetrics.New(cfg.TLS))
	}
	if a.ip = cfg.IP; !a.ip.IsValid() {
		if a.ip, err = underlayIP(client.Masters()[0]); err != nil {
			return nil, err
		}
	}
	if a.store, err = store.Open(cfg.DataDir); err != nil {
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
	// The claim key signs this agent's claims on address space; its
	// public half goes into the registration (and the signed record).
	if a.claimKey, err = pki.LoadOrCreateClaimKey(filepath.Join(cfg.DataDir, pki.ClaimKeyFile)); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.log = cfg.Logger.With("agent", a.id)
	a.meshPeers = meshpeers.New(a.id, cfg.MeshPeers)
	if len(sec.insecure) > 0 {
		a.log.Warn("--insecure: the agent runs without " + strings.Join(sec.insecure, ", without ") + "; for a throwaway lab only")
	}
	p, err := a.store.Load()
	if err != nil {
		return nil, err
	}
	a.self, a.network, a.masterIndex, a.clusterID, a.restoreEpoch = p.Self, p.Network, p.MasterIndex, p.ClusterID, p.RestoreEpoch
	a.restoreFloor = p.RestoreFloor
	a.signingKey = p.SigningKey
	if cfg.SigningKey != nil {
		if p.SigningKey != nil && !p.SigningKey.Equal(cfg.SigningKey) {
			a.log.Warn("--signing-pub-file replaces the signing key pinned in --data-dir", "pinned", api.SigningKeyFingerprint(p.SigningKey), "key", api.SigningKeyFingerprint(cfg.SigningKey))
		}
		a.signingKey = cfg.SigningKey
	}
	if refused := a.loadMembership(p); len(refused) > 0 {
		// Saved records that no longer verify (another key given, a
		// format this version cannot read): the kernel keeps them until
		// the masters' state verifies (verify.go).
		a.unverified = unverifiedOf(p.Membership, a.members)
		a.setRefusing(fmt.Sprintf("%d saved records or tombstones do not verify (first: %v)", len(refused), refused[0].Err))
	}
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
		Reclaim: cfg.Reclaim, OnSent: a.sentCounter(ipam.RingChannel), ClaimKey: a.claimKey,
		ForgetNeighbour: a.forgetNeighbour})
	if err != nil {
		return nil, err
	}
	a.ipam = svc
	if a.wg, err = encryption.New(a.cfg.DataDir, a.cfg.WireGuard, a.registry, a.log); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
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
	if a.dp, err = vxlan.New(vxlan.Options{NetNS: cfg.NetNS, Logger: a.log, NoFastPath: cfg.NoFastPath}); err != nil {
		return nil, fmt.Errorf("agent: dataplane: %w", err)
	}
	if a.fw, err = firewall.New(firewall.Options{NetNS: cfg.NetNS, Logger: a.log, Registerer: a.registry}); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.kernel = kernel.New(kernel.Options{Dataplane: a.dp, Firewall: a.fw, ID: a.id, Local: a.ip, Logger: a.log, Registerer: a.registry})
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
	r, err := gossip.NewMeshRouter(gossip.MeshConfig{ID: a.id, Host: host, Port: p, Password: a.cfg.MeshPassword, AcceptedPasswords: a.cfg.MeshAcceptedPasswords, Logger: a.log,
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

// overlayMTU is the overlay MTU the agent programs: the one the last
// reconcile computed (kernel.Kernel.WithMTUs), or computed now before the
// first.
func (a *Agent) overlayMTU() int {
	if mtu := a.kernel.OverlayMTU(); mtu > 0 {
		return mtu
	}
	a.mu.RLock()
	network := a.network
	a.mu.RUnlock()
	return a.kernel.WithMTUs(network, a.members.State().Records).OverlayMTU
}

// refreshUnderlayMTU reads this agent's underlay MTU, registered and
// planned with (kernel.Kernel.RefreshUnderlayMTU).
func (a *Agent) refreshUnderlayMTU() int { return a.kernel.RefreshUnderlayMTU() }

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

// Docker is the agent's Docker plugin (nil when it is off).
func (a *Agent) Docker() *dockeripam.Service { return a.docker }

// Registry is the Prometheus registry served on /metrics.
func (a *Agent) Registry() *prometheus.Registry { return a.registry }

// Run runs the agent until ctx ends. The kernel state stays as it is when it
// returns, so containers keep talking while the agent restarts, but for
// the FORWARD accept rules it kept, which it removes: on a host whose
// FORWARD policy drops, forwarding for the overlay stops until it is back.
func (a *Agent) Run(ctx context.Context) error {
	defer a.closeResources()
	if err := a.router.Start(); err != nil {
		return fmt.Errorf("agent: start gossip on %s: %w", a.cfg.MeshAddr, err)
	}
	srv := httpapi.NewServer(a.routes(), httpapi.ServerOptions{TLS: a.sec.server,
		ErrorLog: httpapi.NewErrorLog(a.log, a.metrics.tlsFailures.Inc)})
	// Every goroutine of the agent is owned by bg: Run waits for them all
	// (the IPAM's own among them, see ipam.Service.Run) before it saves
	// and closes the store.
	bg := goroutines.New(ctx)
	run := func(f func(context.Context)) { bg.Go(f) }
	run(func(context.Context) {
		if err := srv.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("http server stopped", "err", err)
		}
	})
	var debug *httpapi.Server
	if a.debugLn != nil {
		debug = httpapi.NewServer(debugRoutes(), httpapi.ServerOptions{WriteTimeout: debugWriteTimeout,
			ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)})
		run(func(context.Context) {
			if err := debug.Serve(a.debugLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("debug http server stopped", "err", err)
			}
		})
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
	run(func(ctx context.Context) { a.wg.RotateLoop(ctx, wgRegistrar{a}) })
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
	bg.Stop()
	// The reconcile loop has ended: nothing puts the rules back.
	a.kernel.RemoveForwardRules()
	a.save("final save")
	a.log.Info("agent stopped; the kernel state is left in place, but for the FORWARD accept rules")
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
	if a.fw != nil {
		a.fw.Close()
	}
	if a.wg != nil {
		a.wg.Close()
	}
	if a.ipam != nil {
		a.ipam.Close() // its goroutines write the store: they end first
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

// urlHostPort returns HOST:PORT of a master URL (port 80 when absent).
func urlHostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("master URL %q: want http://HOST:PORT", raw)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "80"), nil
	}
	return u.Host, nil
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
