// Package master is the carve master: the lease allocation rules, the
// network-config validation, and the HTTP server, on top of a raftlog node
// that replicates the LeaseTable.
package master

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
)

// Options configure a master.
type Options struct {
	ID       string
	DataDir  string
	HTTPAddr string // listen address; port 0 picks one (see Master.HTTPAddr)
	// HTTPListener, if set, is used instead of listening on HTTPAddr.
	HTTPListener net.Listener
	RaftAddr     string // listen and advertise address; port 0 picks one
	// Peers are the initial voters; every master gets the same list and
	// bootstraps only when it has no Raft state yet.
	Peers []raftlog.Server
	// Network is the validated configuration from this master's file.
	Network api.NetworkConfig
	// Join is the URL of a running master to join as a voter (a master not in Peers).
	Join   string
	Logger *slog.Logger
	// TuneRaft may adjust the Raft configuration (tests shorten timeouts).
	TuneRaft func(*raftlog.Config)

	// TLS names the cluster CA and this master's certificate (role master)
	// and key: the API serves HTTPS and authorizes by the client's role,
	// the Raft transport runs mutual TLS between masters, and forwarding
	// and Join dial with this certificate. Required unless Insecure.
	TLS pki.Files
	// SigningKey signs every agent record and tombstone the API shows
	// (signing.key of carve certs ca). Required with TLS; optional with
	// Insecure.
	SigningKey ed25519.PrivateKey
	// Insecure runs the API and Raft without TLS or authentication, and
	// logs InsecureWarning: for a throwaway lab only.
	Insecure bool
	// HTTPServer bounds the API server (timeouts, header size, connection
	// cap); zero fields take httpapi's defaults. Its TLS and ErrorLog are
	// the master's own.
	HTTPServer httpapi.ServerOptions
	// TombstoneMaxAge is how long a deleted agent's tombstone is kept
	// (measured by the leader's clock; DefaultTombstoneMaxAge when 0): an
	// agent away longer than that reads the whole state when it comes
	// back. See changes.go.
	TombstoneMaxAge time.Duration
	// CompactEvery is how often the leader proposes a compaction
	// (TombstoneMaxAge/24 when 0).
	CompactEvery time.Duration
}

// DefaultTombstoneMaxAge is Options.TombstoneMaxAge's default.
const DefaultTombstoneMaxAge = 24 * time.Hour

// Master is a running master: a Raft node, its lease table and the HTTP API.
type Master struct {
	opts     Options
	log      *slog.Logger
	table    *LeaseTable
	node     *raftlog.Node
	registry *prometheus.Registry
	metrics  *metrics
	security *security // nil with Options.Insecure
	httpSrv  *httpapi.Server
	httpLn   net.Listener
	// joinClient reaches Options.Join (nil without one).
	joinClient *api.Client
	// releaseKick wakes the leader's duties when a usage report gave a
	// holdings acknowledgement (a quarantine release may be due).
	releaseKick chan struct{}

	runCtx    context.Context // done when the master closes
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

type metrics struct {
	registrations *prometheus.CounterVec
	reports       *prometheus.CounterVec
	allocFailures *prometheus.CounterVec
	httpRequests  *prometheus.CounterVec
	forwarded     prometheus.Counter
	authRefusals  *prometheus.CounterVec
	grown         prometheus.Counter
	returned      prometheus.Counter
	grantsLearned prometheus.Counter
	growRefused   *prometheus.CounterVec
	released      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, t *LeaseTable) *metrics {
	m := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_registrations_total", Help: "Agent registrations answered by this master, by result.",
		}, []string{"result"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_agent_reports_total",
			Help: "Agents' configuration reports answered by this master, by result (ok: committed, unchanged: no log entry needed).",
		}, []string{"result"}),
		allocFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_allocation_failures_total", Help: "Leases that could not be allocated, by reason.",
		}, []string{"reason"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_http_requests_total", Help: "HTTP requests, by method, route and status code.",
		}, []string{"method", "route", "code"}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_master_forwarded_requests_total", Help: "Requests this follower proxied to the leader.",
		}),
		authRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_auth_refusals_total",
			Help: "API requests refused by authentication (401) or authorization (403), by reason: no_certificate, forbidden_role, wrong_agent.",
		}, []string{"reason"}),
	}
	m.grown = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_blocks_grown_total", Help: "Blocks leased to agents that asked to grow (answered by this master as leader).",
	})
	m.returned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_blocks_returned_total", Help: "Block returns committed (answered by this master as leader).",
	})
	m.grantsLearned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_grants_learned_total", Help: "Ring grant reports committed (answered by this master as leader), repeats included.",
	})
	m.growRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_master_grow_refused_total", Help: "Grow requests refused, by reason: exhausted, invalid, unknown_agent, other.",
	}, []string{"reason"})
	m.released = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_quarantine_released_total", Help: "Quarantined blocks of deleted agents freed by releases this master proposed.",
	})
	for _, r := range []string{growRefusedExhausted, growRefusedInvalid, growRefusedUnknown, growRefusedOther} {
		m.growRefused.WithLabelValues(r)
	}
	quarantined := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_quarantined_blocks", Help: "Blocks of deleted agents' space not yet leasable again (quarantine).",
	}, func() float64 { return float64(t.QuarantinedCount()) })
	reg.MustRegister(m.grown, m.returned, m.grantsLearned, m.growRefused, m.released, quarantined)
	// Export zeros for the known labels, so dashboards and alerts see the series.
	for _, r := range []string{"ok", "unchanged", "error", "bad_request"} {
		m.registrations.WithLabelValues(r)
		m.reports.WithLabelValues(r)
	}
	for _, r := range []string{"vtep_exhausted", "overlay_subnet_exhausted"} {
		m.allocFailures.WithLabelValues(r)
	}
	for _, r := range []string{refusedNoCertificate, refusedRole, refusedWrongAgent} {
		m.authRefusals.WithLabelValues(r)
	}
	agents := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_agents", Help: "Agents in the lease table.",
	}, func() float64 { return float64(t.AgentCount()) })
	stateIndex := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_state_index", Help: "Raft index of the last change of the lease table.",
	}, func() float64 { return float64(t.Index()) })
	reg.MustRegister(m.registrations, m.reports, m.allocFailures, m.httpRequests, m.forwarded, m.authRefusals, agents, stateIndex)
	return m
}

// Start opens the Raft node from DataDir, starts the HTTP API and the
// leader's duties, and joins a running cluster when Options.Join is set.
func Start(ctx context.Context, opts Options) (*Master, error) {
	if opts.ID == "" {
		return nil, errors.New("master: --id is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.TombstoneMaxAge <= 0 {
		opts.TombstoneMaxAge = DefaultTombstoneMaxAge
	}
	if opts.CompactEvery <= 0 {
		opts.CompactEvery = max(opts.TombstoneMaxAge/24, 10*time.Millisecond)
	}
	if _, err := parseNetwork(WithDefaults(opts.Network)); err != nil {
		return nil, err
	}
	m := &Master{opts: opts, log: opts.Logger.With("master", opts.ID), table: NewLeaseTable(), registry: prometheus.NewRegistry(),
		releaseKick: make(chan struct{}, 1)}
	sec, err := newSecurity(opts, m.log)
	if err != nil {
		return nil, err
	}
	m.security = sec
	if opts.Insecure {
		m.log.Warn(InsecureWarning)
	}
	m.table.SetSigningKey(opts.SigningKey)
	if opts.Join != "" {
		copts := api.ClientOptions{}
		if sec != nil {
			copts.TLS = sec.client
		}
		if m.joinClient, err = api.NewClientWith([]string{opts.Join}, copts); err != nil {
			return nil, fmt.Errorf("master: --join: %w", err)
		}
	}
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.metrics = newMetrics(m.registry, m.table)

	ln := opts.HTTPListener
	if ln == nil {
		if ln, err = net.Listen("tcp", opts.HTTPAddr); err != nil {
			return nil, fmt.Errorf("listen on --http-addr %s: %w", opts.HTTPAddr, err)
		}
	}
	if err := checkAdvertisable(ln.Addr()); err != nil {
		ln.Close()
		addr := opts.HTTPAddr
		if opts.HTTPListener != nil {
			addr = ln.Addr().String()
		}
		return nil, fmt.Errorf("master: --http-addr %s: %w", addr, err)
	}
	m.httpLn = ln

	rcfg := raftlog.Config{
		ID: opts.ID, RaftAddr: opts.RaftAddr, DataDir: opts.DataDir, Peers: opts.Peers,
		Logger: opts.Logger, Registerer: m.registry,
	}
	if sec != nil {
		rcfg.TLS = sec.raft
	}
	// Followers learn the commit index from the next AppendEntries; a short
	// commit timeout wakes the agents' blocking watches on followers within
	// ~10 ms of a commit instead of ~100 ms (a small idle message per tick).
	rcfg.CommitTimeout = 10 * time.Millisecond
	if opts.TuneRaft != nil {
		opts.TuneRaft(&rcfg)
	}
	node, err := raftlog.Open(ctx, rcfg, m.table)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("open raft: %w", err)
	}
	m.node = node

	runCtx, cancel := context.WithCancel(context.Background())
	m.runCtx, m.cancel = runCtx, cancel
	srvOpts := opts.HTTPServer
	srvOpts.TLS = nil
	if sec != nil {
		srvOpts.TLS = sec.http
	}
	srvOpts.ErrorLog = slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn)
	m.httpSrv = httpapi.NewServer(m.routes(), srvOpts)
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		if err := m.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server stopped", "err", err)
		}
	}()
	go func() {
		defer m.wg.Done()
		m.leaderDuties(runCtx)
	}()
	if opts.Join != "" {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.joinCluster(runCtx)
		}()
	}
	m.log.Info("master started", "url", m.URL(), "raft_addr", node.Addr(), "data_dir", opts.DataDir, "tls", sec != nil, "signing", opts.SigningKey != nil)
	return m, nil
}

// HTTPAddr is the address the HTTP API listens on.
func (m *Master) HTTPAddr() string { return m.httpLn.Addr().String() }

// URL is the API's base URL: https:// with TLS, http:// with Insecure.
func (m *Master) URL() string { return m.scheme() + m.HTTPAddr() }

// HTTPConns is the number of connections the API server holds now.
func (m *Master) HTTPConns() int { return m.httpSrv.Conns() }

// RaftAddr is the Raft transport's address.
func (m *Master) RaftAddr() string { return m.node.Addr() }

// Node exposes the Raft node (tests and status).
func (m *Master) Node() *raftlog.Node { return m.node }

// Table exposes the lease table (tests).
func (m *Master) Table() *LeaseTable { return m.table }

// Registry is the Prometheus registry served on /metrics.
func (m *Master) Registry() *prometheus.Registry { return m.registry }

// leaderDuties runs, whenever this node leads and has caught up with the
// log, what only a leader does: commit a cluster id when the log has none,
// publish its HTTP address in the log (followers proxy to it) and commit its
// network configuration file when it differs from the committed one.
func (m *Master) leaderDuties(ctx context.Context) {
	changes := m.node.LeaderChanges()
	caughtUp := m.node.CaughtUp()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	compact := time.NewTicker(m.opts.CompactEvery)
	defer compact.Stop()
	for {
		if m.node.IsLeader() && m.node.IsCaughtUp() {
			if err := m.leaderSetup(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("leader setup", "err", err)
			}
			if err := m.releaseQuarantine(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("quarantine release", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-m.releaseKick:
		case <-changes:
		case <-caughtUp:
			caughtUp = nil // closed for good: wait on it once
		case <-tick.C:
		case <-compact.C:
			if m.node.IsLeader() && m.node.IsCaughtUp() {
				m.proposeCompaction(ctx)
			}
		}
	}
}

// proposeCompaction has the log compact the tombstones older than
// TombstoneMaxAge by this leader's clock (applyCompact decides which).
func (m *Master) proposeCompaction(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	before := m.table.Horizon()
	c := &compactCmd{Now: time.Now().UnixMilli(), MaxAge: max(m.opts.TombstoneMaxAge.Milliseconds(), 1)}
	if err := m.propose(ctx, command{Op: opCompact, Compact: c}); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("propose tombstone compaction", "err", err)
		}
		return
	}
	if after := m.table.Horizon(); after != before {
		m.log.Info("tombstones compacted", "horizon", after)
	}
}

func (m *Master) leaderSetup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m.table.ClusterID() == "" {
		id, err := newClusterID()
		if err != nil {
			return err
		}
		// Should another leader have committed one first, that one stays.
		if err := m.propose(ctx, command{Op: opSetClusterID, ClusterID: id}); err != nil {
			return fmt.Errorf("commit cluster id: %w", err)
		}
		m.log.Info("cluster id committed", "cluster_id", m.table.ClusterID())
	}
	self := serverMeta{ID: m.opts.ID, RaftAddr: m.node.Addr(), HTTPAddr: m.HTTPAddr()}
	if cur, ok := m.table.Server(m.opts.ID); !ok || cur != self {
		if err := m.propose(ctx, command{Op: opServerMeta, ServerMeta: &self}); err != nil {
			return fmt.Errorf("publish http address: %w", err)
		}
	}
	change, warnings, err := m.table.ConfigChange(m.opts.Network)
	if err != nil {
		return fmt.Errorf("network config: %w", err)
	}
	if !change {
		return nil
	}
	for _, w := range warnings {
		m.log.Warn("network config", "warning", w)
	}
	if err := m.propose(ctx, command{Op: opSetConfig, SetConfig: &m.opts.Network}); err != nil {
		return fmt.Errorf("commit network config: %w", err)
	}
	m.log.Info("network config committed", "overlays", len(m.opts.Network.Overlays))
	return nil
}

// kickRelease asks the leader's duties to look for a quarantine release.
func (m *Master) kickRelease() {
	select {
	case m.releaseKick <- struct{}{}:
	default:
	}
}

// releaseQuarantine proposes a quarantine release when the holdings
// acknowledgements this leader received cover every live agent past the
// deletion of some quarantined space.
func (m *Master) releaseQuarantine(ctx context.Context) error {
	cmd, ok := m.table.ReleaseProposal()
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	data, err := encodeCommand(command{Op: opRelease, Release: cmd})
	if err != nil {
		return err
	}
	out, _, err := m.node.Apply(ctx, data)
	if err != nil {
		return fmt.Errorf("commit quarantine release: %w", err)
	}
	if res, ok := out.(applyResult); ok && res.Released > 0 {
		m.metrics.released.Add(float64(res.Released))
		m.log.Info("quarantine released", "blocks", res.Released)
	}
	return nil
}

// propose applies a command and returns its deterministic error, if any.
func (m *Master) propose(ctx context.Context, c command) error {
	data, err := encodeCommand(c)
	if err != nil {
		return err
	}
	out, _, err := m.node.Apply(ctx, data)
	if err != nil {
		return err
	}
	if res, ok := out.(applyResult); ok && res.Err != nil {
		return res.Err
	}
	return nil
}

// newClusterID draws the id that names a new cluster's log.
func newClusterID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw a cluster id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// joinCluster asks the masters at Options.Join to add this node, until one agrees.
func (m *Master) joinCluster(ctx context.Context) {
	client := m.joinClient
	req := api.JoinRequest{ID: m.opts.ID, RaftAddr: m.node.Addr(), HTTPAddr: m.HTTPAddr()}
	backoff := retry.Backoff{First: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := client.Join(cctx, req)
		cancel()
		if err == nil {
			m.log.Info("joined the cluster", "via", m.opts.Join)
			return
		}
		wait := backoff.Next()
		m.log.Warn("join failed, retrying", "via", m.opts.Join, "err", err, "in", wait)
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// ClusterStatus is this node's view of the Raft cluster.
func (m *Master) ClusterStatus() api.ClusterStatus {
	st := m.node.Status()
	out := api.ClusterStatus{
		ID: m.opts.ID, Role: st.Role, Term: st.Term, CommitIndex: st.CommitIndex,
		AppliedIndex: st.AppliedIndex, LastIndex: st.LastIndex, LastSnapshotIndex: st.LastSnapshotIndex,
		ClusterID: m.table.ClusterID(), CaughtUp: st.CaughtUp, Servers: []api.ServerInfo{},
	}
	for _, srv := range st.Servers {
		info := api.ServerInfo{ID: srv.ID, RaftAddr: srv.Address, Voter: srv.Voter}
		if meta, ok := m.table.Server(srv.ID); ok && meta.HTTPAddr != "" {
			info.HTTPAddr, info.URL = meta.HTTPAddr, m.scheme()+meta.HTTPAddr
		}
		out.Servers = append(out.Servers, info)
	}
	if st.LeaderID != "" {
		l := &api.ServerInfo{ID: st.LeaderID, RaftAddr: st.LeaderAddr, Voter: true}
		if meta, ok := m.table.Server(st.LeaderID); ok && meta.HTTPAddr != "" {
			l.HTTPAddr, l.URL = meta.HTTPAddr, m.scheme()+meta.HTTPAddr
		}
		out.Leader = l
	}
	return out
}

// Close stops the HTTP API and the Raft node; idempotent.
func (m *Master) Close() error {
	m.closeOnce.Do(func() {
		m.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// Blocking state queries end on runCtx, so Shutdown does not wait for them.
		_ = m.httpSrv.Shutdown(ctx)
		_ = m.httpSrv.Close()
		m.closeErr = m.node.Close()
		m.wg.Wait()
		m.log.Info("master stopped")
	})
	return m.closeErr
}
