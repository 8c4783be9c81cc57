// Package master runs a carve master: the process (Start, Close), the
// leader's duties, and the HTTP API that serves the lease table of
// master/state, authenticates and authorizes its clients, and proposes
// their writes through the raftlog node that replicates the table, or
// forwards them to the leader.
package master

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/buildinfo"
	"github.com/carve-net/carve/internal/certmetrics"
	"github.com/carve-net/carve/internal/goroutines"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/master/usage"
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
	// RestoreFrom is a snapshot (carve snapshot save) that the first leader
	// of a new cluster commits before anything else: a whole-cluster
	// restore onto empty data directories. Ignored once the log has a
	// cluster id.
	RestoreFrom []byte
	// Join is the URL of a running master to join as a voter (a master not in Peers).
	Join   string
	Logger *slog.Logger
	// LogLevel is the level behind Logger, which an operator may change at
	// run time (GET|PUT /log-level); nil: no such route.
	LogLevel *slog.LevelVar
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
	// SigningChain endorses SigningKey with the keys before it while the
	// key is rotated (carve certs rotate-signing); nil outside a rotation.
	SigningChain *api.SigningChain
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
	// AgentSilentAfter is how long an agent may go unheard before the
	// leader shows it silent (usage.DefaultSilentAfter when 0).
	AgentSilentAfter time.Duration
	// ChangeLogIDs bounds the change log the changes watch answers from
	// (changelog.DefaultIDs when 0).
	ChangeLogIDs int
	// StreamWriteTimeout is how long past its heartbeat a changes stream
	// may go without its client reading before it is dropped
	// (changestream.DefaultWriteTimeout when 0). Tests shorten it.
	StreamWriteTimeout time.Duration
}

// DefaultTombstoneMaxAge is Options.TombstoneMaxAge's default.
const DefaultTombstoneMaxAge = 24 * time.Hour

// Master is a running master: a Raft node, its lease table and the HTTP API.
type Master struct {
	// configDiffersSaid is the last difference between this master's file
	// and the committed configuration it logged (leaderDuties only).
	configDiffersSaid string

	opts     Options
	log      *slog.Logger
	table    *state.LeaseTable
	node     *raftlog.Node
	registry *prometheus.Registry
	metrics  *metrics
	security *security // nil with Options.Insecure
	httpSrv  *httpapi.Server
	httpLn   net.Listener
	// joinClient reaches Options.Join (nil without one).
	joinClient *apiclient.Client
	// releaseKick wakes the leader's duties when a usage report gave a
	// holdings acknowledgement (a quarantine release may be due).
	releaseKick chan struct{}
	// signingKey is the record-signing key as last set (Start, SetSigning):
	// the private half that checks agents' WireGuard proofs (wgproof.go).
	signingKey atomic.Pointer[ed25519.PrivateKey]

	// dataDir is whether this master can write its data dir (health.go).
	dataDir *dataDirHealth

	runCtx context.Context // done when the master closes
	cancel context.CancelFunc
	// bg owns the master's goroutines (the API server, the leader's
	// duties, the join, the revocation watch): Close waits for them.
	bg        *goroutines.Group
	closeOnce sync.Once
	closeErr  error
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
	if opts.AgentSilentAfter <= 0 {
		opts.AgentSilentAfter = usage.DefaultSilentAfter
	}
	if opts.CompactEvery <= 0 {
		opts.CompactEvery = max(opts.TombstoneMaxAge/24, 10*time.Millisecond)
	}
	if err := netconfig.Validate(opts.Network); err != nil {
		return nil, err
	}
	m := &Master{opts: opts, log: opts.Logger.With("master", opts.ID), table: state.NewLeaseTable(), registry: prometheus.NewRegistry(),
		releaseKick: make(chan struct{}, 1)}
	if opts.ChangeLogIDs > 0 {
		m.table.SetChangeLogIDs(opts.ChangeLogIDs)
	}
	sec, err := newSecurity(opts, m.log)
	if err != nil {
		return nil, err
	}
	m.security = sec
	if opts.Insecure {
		m.log.Warn(InsecureWarning)
	}
	if err := m.table.SetSigning(opts.SigningKey, opts.SigningChain); err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	m.signingKey.Store(&opts.SigningKey)
	if opts.Join != "" {
		copts := apiclient.ClientOptions{}
		if sec != nil {
			copts.TLS = sec.client
		}
		if m.joinClient, err = apiclient.NewClientWith([]string{opts.Join}, copts); err != nil {
			return nil, fmt.Errorf("master: --join: %w", err)
		}
	}
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector(buildinfo.Get()))
	m.metrics = newMetrics(m.registry, m.table, m.connCounts)
	m.dataDir = newDataDirHealth(m.registry)
	m.registry.MustRegister(m.silentAgentsGauge(), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_config_file_differs",
		Help: "1 when this master's --config file differs from the committed network configuration (the file only starts a new cluster; carve config apply changes the committed one).",
	}, func() float64 {
		if m.configDiffers() != "" {
			return 1
		}
		return 0
	}))
	if opts.TLS.Enabled() {
		m.registry.MustRegister(certmetrics.New(opts.TLS))
	}
	if sec != nil {
		m.refuseRevokedPeers(sec)
	}

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
	if err := m.checkMembership(); err != nil {
		_ = node.Close()
		ln.Close()
		return nil, err
	}

	runCtx, cancel := context.WithCancel(context.Background())
	m.runCtx, m.cancel = runCtx, cancel
	srvOpts := opts.HTTPServer
	srvOpts.TLS = nil
	if sec != nil {
		srvOpts.TLS = sec.http
	}
	srvOpts.ErrorLog = httpapi.NewErrorLog(opts.Logger, m.metrics.trust.handshakeFailures.Inc)
	m.httpSrv = httpapi.NewServer(m.routes(), srvOpts)
	m.bg = goroutines.New(runCtx)
	m.bg.Go(func(context.Context) {
		if err := m.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server stopped", "err", err)
		}
	})
	m.bg.Go(m.leaderDuties)
	m.bg.Go(m.probeDataDir)
	if sec != nil {
		m.bg.Go(m.watchRevocations)
	}
	if opts.Join != "" {
		m.bg.Go(m.joinCluster)
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
func (m *Master) Table() *state.LeaseTable { return m.table }

// Registry is the Prometheus registry served on /metrics.
func (m *Master) Registry() *prometheus.Registry { return m.registry }

// ClusterStatus is this node's view of the Raft cluster.
func (m *Master) ClusterStatus() api.ClusterStatus {
	st := m.node.Status()
	out := api.ClusterStatus{
		ID: m.opts.ID, Role: st.Role, Term: st.Term, CommitIndex: st.CommitIndex,
		AppliedIndex: st.AppliedIndex, LastIndex: st.LastIndex, LastSnapshotIndex: st.LastSnapshotIndex,
		ClusterID: m.table.ClusterID(), CaughtUp: st.CaughtUp, Servers: []api.ServerInfo{},
		Build: buildInfo(), AgentVersions: m.table.AgentVersions(), StateDigests: m.table.StateDigests(),
		ConfigDiffers: m.configDiffers(), DataDirError: m.dataDir.problem(),
		History: st.History, HistoryConflict: st.HistoryConflict,
	}
	if out.History == "" {
		out.History = m.table.History()
	}
	if m.security != nil {
		if spki, ok := m.security.files.IssuerKey(); ok {
			out.CertificateCA = api.CAFingerprint(spki)
		}
	}
	if st.Role == "leader" {
		out.SilentAgents, out.SilentAfter = m.table.SilentAgents(), m.opts.AgentSilentAfter.String()
	}
	out.ExhaustedOverlays = m.table.Exhausted()
	m.fillAgentTrust(&out, st.Role == "leader")
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
		m.bg.Stop()
		m.log.Info("master stopped")
	})
	return m.closeErr
}
