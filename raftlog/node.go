package raftlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/bbolt"
)

// Defaults for the optional tuning fields of Config. The timeouts are raft's
// own defaults, suited to a LAN; MaxAppendEntries is raised from raft's 64 so
// that many concurrent Apply calls share one disk write and one RPC.
const (
	DefaultHeartbeatTimeout   = 1000 * time.Millisecond
	DefaultElectionTimeout    = 1000 * time.Millisecond
	DefaultLeaderLeaseTimeout = 500 * time.Millisecond
	DefaultCommitTimeout      = 50 * time.Millisecond
	DefaultSnapshotThreshold  = 8192
	DefaultSnapshotInterval   = 120 * time.Second
	DefaultTrailingLogs       = 10240
	DefaultMaxAppendEntries   = 1024

	// snapshotRetain is how many snapshots FileSnapshotStore keeps.
	snapshotRetain = 2
	// logCacheSize is how many recent entries are kept in memory so that
	// replication to followers does not read them back from bolt.
	logCacheSize = 2048
	// transportTimeout bounds one transport I/O operation (raft also uses it
	// to scale InstallSnapshot timeouts).
	transportTimeout = 10 * time.Second
	// transportMaxPool is the number of pooled connections per peer.
	transportMaxPool = 3
	// boltOpenTimeout bounds the wait for the data directory's file lock, so
	// that a second process on the same directory fails instead of hanging.
	boltOpenTimeout = 5 * time.Second
	// raftDBFile is the single bolt file holding both log and stable store.
	raftDBFile = "raft.db"
)

// Server is one member of the Raft configuration.
type Server struct {
	// ID is the stable identity of the server; it never changes, even when
	// its address does.
	ID string
	// Address is its Raft TCP address (HOST:PORT).
	Address string
	// Voter tells whether it votes and counts for quorum. In Config.Peers it is
	// ignored: every initial peer is a voter.
	Voter bool
}

// Config describes one node. Zero tuning values take the Default* constants,
// except that a zero ElectionTimeout equals HeartbeatTimeout, and zero
// LeaderLeaseTimeout and CommitTimeout are capped at HeartbeatTimeout/2 and
// /4 so that setting HeartbeatTimeout alone gives a valid configuration.
type Config struct {
	// ID is this node's stable identity in the cluster.
	ID string
	// RaftAddr is the address to bind and advertise (HOST:PORT, with an
	// explicit, non-wildcard host). Port 0 picks a free port (Node.Addr
	// tells which); that suits a node that joins through AddVoter, while
	// bootstrapping from Peers needs the addresses up front (see Listener).
	// Ignored when Listener is set.
	RaftAddr string
	// Listener, if set, is an already bound TCP listener to use instead of
	// binding RaftAddr; its address is advertised. This lets tests (or socket
	// activation) know every node's address before any node starts, which
	// bootstrapping from a Peers list requires. The node closes it on Close.
	Listener net.Listener
	// DataDir holds raft.db (log and stable store) and snapshots/.
	DataDir string
	// Peers are the initial voters. A node bootstraps the cluster with this
	// list only if it has no Raft state yet and its ID is in the list (with
	// an Address equal to its own advertised address). Later changes go
	// through AddVoter/RemoveServer; Peers is not consulted again.
	Peers []Server
	// Logger receives raft's and this package's logs. Nil discards them.
	Logger *slog.Logger
	// Registerer, if not nil, receives this node's metrics. Nothing is
	// registered globally.
	Registerer prometheus.Registerer

	// HeartbeatTimeout is how long a follower waits without contact from a
	// leader before starting an election.
	HeartbeatTimeout time.Duration
	// ElectionTimeout is how long a candidate waits before a new election; at
	// least HeartbeatTimeout.
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout is how long a leader stays leader without hearing
	// from a quorum; at most HeartbeatTimeout.
	LeaderLeaseTimeout time.Duration
	// CommitTimeout is how long the leader waits without new entries before
	// sending an AppendEntries that carries the commit index.
	CommitTimeout time.Duration
	// SnapshotThreshold is the number of new entries after which a snapshot
	// is taken (checked every SnapshotInterval).
	SnapshotThreshold uint64
	// SnapshotInterval is how often the snapshot threshold is checked.
	SnapshotInterval time.Duration
	// TrailingLogs is how many entries are kept in the log after a snapshot,
	// so that slightly lagging followers catch up without a full snapshot.
	TrailingLogs uint64
	// MaxAppendEntries is the maximum number of entries written or sent in
	// one batch, and the size of the apply queue (1..1024).
	MaxAppendEntries int
}

// withDefaults validates cfg and fills in defaults.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.ID == "" {
		return cfg, errors.New("raftlog: config: ID is required")
	}
	if cfg.DataDir == "" {
		return cfg, errors.New("raftlog: config: DataDir is required")
	}
	if cfg.Listener == nil && cfg.RaftAddr == "" {
		return cfg, errors.New("raftlog: config: RaftAddr or Listener is required")
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = cfg.HeartbeatTimeout
	}
	if cfg.LeaderLeaseTimeout == 0 {
		cfg.LeaderLeaseTimeout = min(DefaultLeaderLeaseTimeout, cfg.HeartbeatTimeout/2)
	}
	if cfg.CommitTimeout == 0 {
		cfg.CommitTimeout = min(DefaultCommitTimeout, cfg.HeartbeatTimeout/4)
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = DefaultSnapshotThreshold
	}
	if cfg.SnapshotInterval == 0 {
		cfg.SnapshotInterval = DefaultSnapshotInterval
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = DefaultTrailingLogs
	}
	if cfg.MaxAppendEntries == 0 {
		cfg.MaxAppendEntries = DefaultMaxAppendEntries
	}
	ids := map[string]bool{}
	addrs := map[string]bool{}
	for i, p := range cfg.Peers {
		if p.ID == "" || p.Address == "" {
			return cfg, fmt.Errorf("raftlog: config: Peers[%d]: ID and Address are required", i)
		}
		if ids[p.ID] {
			return cfg, fmt.Errorf("raftlog: config: Peers: duplicate ID %q", p.ID)
		}
		if addrs[p.Address] {
			return cfg, fmt.Errorf("raftlog: config: Peers: duplicate Address %q", p.Address)
		}
		ids[p.ID], addrs[p.Address] = true, true
	}
	return cfg, nil
}

func (cfg Config) raftConfig(logger *slog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	// Buffer the apply channel so that concurrent callers enqueue without
	// waiting for the leader loop, which then takes them as one batch.
	rc.BatchApplyCh = true
	// A removed node stays up as a follower outside the configuration (it
	// never starts elections) so that its Node keeps answering Status.
	rc.ShutdownOnRemove = false
	rc.NoLegacyTelemetry = true
	rc.Logger = newHCLogger(logger, "raft")
	return rc
}

// Node is a running Raft member. All methods are safe for concurrent use.
type Node struct {
	id     string
	addr   string
	cfg    Config
	logger *slog.Logger

	raft    *raft.Raft
	fsm     *fsmAdapter
	store   *raftboltdb.BoltStore
	logs    raft.LogStore // store behind an in-memory cache of recent entries
	trans   *raft.NetworkTransport
	metrics *nodeMetrics

	bootstrapped bool // this Open bootstrapped a new cluster

	// readyTerm is the last term in which this node, as leader, saw one of
	// its own entries committed; ConsistentRead needs that before it can
	// trust the commit index (see there).
	readyTerm atomic.Uint64

	observer *raft.Observer
	obsCh    chan raft.Observation
	obsDone  chan struct{}

	leaderCh chan struct{}
	subMu    sync.Mutex
	subs     map[chan struct{}]struct{}

	closing   chan struct{} // closed when Close starts
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Open starts a node from cfg.DataDir, creating it if needed, and bootstraps
// the cluster if the node has no state and is in cfg.Peers. Opening a data dir
// that has state never bootstraps again and is not an error. Open does not
// wait for a leader nor for the log to be replayed (see the package
// documentation); it never blocks on the network. ctx is checked before
// start-up; the node runs until Close.
func Open(ctx context.Context, cfg Config, sm StateMachine) (_ *Node, err error) {
	if sm == nil {
		return nil, errors.New("raftlog: open: nil StateMachine")
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("raftlog: open: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("raft_id", cfg.ID)

	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if cfg.Listener != nil {
		undo = append(undo, func() { _ = cfg.Listener.Close() })
	}

	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("raftlog: open: create data dir: %w", err)
	}
	store, err := raftboltdb.New(raftboltdb.Options{
		Path: filepath.Join(cfg.DataDir, raftDBFile),
		BoltOptions: &bbolt.Options{
			Timeout:        boltOpenTimeout,
			NoFreelistSync: true,
			FreelistType:   bbolt.FreelistMapType,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("raftlog: open %s: %w", filepath.Join(cfg.DataDir, raftDBFile), err)
	}
	undo = append(undo, func() { _ = store.Close() })
	logs, err := raft.NewLogCache(logCacheSize, store)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open: log cache: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, snapshotRetain, newHCLogger(logger, "raft-snapshots"))
	if err != nil {
		return nil, fmt.Errorf("raftlog: open: snapshot store: %w", err)
	}

	trans, err := newTransport(cfg, logger)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = trans.Close() })
	addr := string(trans.LocalAddr())

	hasState, err := raft.HasExistingState(logs, store, snaps)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open: inspect existing state: %w", err)
	}
	var bootstrap *raft.Configuration
	if !hasState {
		bootstrap, err = bootstrapConfiguration(cfg, addr)
		if err != nil {
			return nil, err
		}
	}

	fsm := newFSMAdapter(sm)
	n := &Node{
		id:       cfg.ID,
		addr:     addr,
		cfg:      cfg,
		logger:   logger,
		fsm:      fsm,
		store:    store,
		logs:     logs,
		trans:    trans,
		metrics:  newNodeMetrics(cfg.Registerer),
		obsCh:    make(chan raft.Observation, 64),
		obsDone:  make(chan struct{}),
		leaderCh: make(chan struct{}, 1),
		subs:     map[chan struct{}]struct{}{},
		closing:  make(chan struct{}),
	}

	r, err := raft.NewRaft(cfg.raftConfig(logger), fsm, logs, store, snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open: start raft: %w", err)
	}
	n.raft = r
	undo = append(undo, func() { _ = r.Shutdown().Error() })

	if bootstrap != nil {
		if err := r.BootstrapCluster(*bootstrap).Error(); err != nil {
			return nil, fmt.Errorf("raftlog: open: bootstrap: %w", err)
		}
		n.bootstrapped = true
		logger.Info("bootstrapped new raft cluster", "servers", len(bootstrap.Servers), "addr", addr)
	} else if hasState {
		logger.Info("raft node restarted from existing state", "addr", addr, "data_dir", cfg.DataDir,
			"last_index", r.LastIndex(), "snapshot_applied_index", fsm.applied.Load())
		for _, p := range cfg.Peers {
			if p.ID == cfg.ID && p.Address != addr {
				logger.Warn("Peers gives this node another address than it advertises; Peers is only used to bootstrap",
					"peers_addr", p.Address, "addr", addr)
			}
		}
	} else {
		logger.Info("raft node started without state and not in peers; waiting to be added by the leader", "addr", addr)
	}

	if err := n.metrics.register(n); err != nil {
		return nil, err
	}
	undo = append(undo, n.metrics.unregister)

	n.observer = raft.NewObserver(n.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			return true
		}
		return false
	})
	r.RegisterObserver(n.observer)
	go n.watchObservations()
	return n, nil
}

// bootstrapConfiguration returns the configuration to bootstrap with, or nil
// when this node must not bootstrap (it is not in Peers).
func bootstrapConfiguration(cfg Config, addr string) (*raft.Configuration, error) {
	var conf raft.Configuration
	self := false
	for _, p := range cfg.Peers {
		if p.ID == cfg.ID {
			self = true
			if p.Address != addr {
				return nil, fmt.Errorf("raftlog: open: Peers gives %s the address %q but it advertises %q", p.ID, p.Address, addr)
			}
		}
		conf.Servers = append(conf.Servers, raft.Server{
			Suffrage: raft.Voter,
			ID:       raft.ServerID(p.ID),
			Address:  raft.ServerAddress(p.Address),
		})
	}
	if !self {
		return nil, nil
	}
	return &conf, nil
}

// streamLayer is raft's TCP stream layer on a listener we bound (or were
// given), so that a pre-bound listener can be used.
type streamLayer struct {
	net.Listener
}

func (s streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", string(address))
}

func newTransport(cfg Config, logger *slog.Logger) (*raft.NetworkTransport, error) {
	ln := cfg.Listener
	if ln == nil {
		host, _, err := net.SplitHostPort(cfg.RaftAddr)
		if err != nil {
			return nil, fmt.Errorf("raftlog: config: RaftAddr %q: %w", cfg.RaftAddr, err)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return nil, fmt.Errorf("raftlog: config: RaftAddr %q: need an explicit host to advertise", cfg.RaftAddr)
		}
		ln, err = net.Listen("tcp", cfg.RaftAddr)
		if err != nil {
			return nil, fmt.Errorf("raftlog: listen on %s: %w", cfg.RaftAddr, err)
		}
	}
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("raftlog: listener address %s is not an advertisable TCP address", ln.Addr())
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  streamLayer{ln},
		MaxPool: transportMaxPool,
		Timeout: transportTimeout,
		Logger:  newHCLogger(logger, "raft-net"),
	}), nil
}

// watchObservations turns raft's leader and state observations into metrics
// and wake-ups for LeaderChanges/Subscribe.
func (n *Node) watchObservations() {
	defer close(n.obsDone)
	var lastLeader raft.ServerID
	for {
		select {
		case o := <-n.obsCh:
			switch d := o.Data.(type) {
			case raft.LeaderObservation:
				if d.LeaderID != "" && d.LeaderID != lastLeader {
					lastLeader = d.LeaderID
					n.metrics.leaderChanges.Inc()
					n.logger.Info("raft leader changed", "leader_id", string(d.LeaderID), "leader_addr", string(d.LeaderAddr))
				}
			case raft.RaftState:
				n.logger.Debug("raft role changed", "role", roleName(d))
			}
			n.signal()
		case <-n.closing:
			return
		}
	}
}

func (n *Node) signal() {
	select {
	case n.leaderCh <- struct{}{}:
	default:
	}
	n.subMu.Lock()
	for ch := range n.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	n.subMu.Unlock()
}

// LeaderChanges returns a channel that receives a value (coalesced, never
// blocking raft) whenever the leader or this node's role changes. The channel
// is the same on every call and meant for ONE consumer (e.g. the HTTP layer's
// watcher loop); use Subscribe when several goroutines need it. After a
// signal, read the current state with Leader, IsLeader or Status.
func (n *Node) LeaderChanges() <-chan struct{} { return n.leaderCh }

// Subscribe is LeaderChanges for many consumers: every subscriber gets its
// own coalesced channel. cancel releases it and must be called when done.
func (n *Node) Subscribe() (ch <-chan struct{}, cancel func()) {
	c := make(chan struct{}, 1)
	n.subMu.Lock()
	n.subs[c] = struct{}{}
	n.subMu.Unlock()
	var once sync.Once
	return c, func() {
		once.Do(func() {
			n.subMu.Lock()
			delete(n.subs, c)
			n.subMu.Unlock()
		})
	}
}

// await waits for f, for ctx and for Close, whichever comes first. raft's
// futures cannot be selected on, and some are never answered after a
// shutdown, hence the helper goroutine.
func (n *Node) await(ctx context.Context, f raft.Future) (err error, completed bool) {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err, true
	default:
	}
	select {
	case err := <-done:
		return err, true
	case <-ctx.Done():
		return ctx.Err(), false
	case <-n.closing:
		return ErrClosed, false
	}
}

// raftTimeout converts ctx's deadline to raft's enqueue timeout (0 = none).
func raftTimeout(ctx context.Context) (time.Duration, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, ctx.Err()
	}
	d := time.Until(dl)
	if d <= 0 {
		return 0, context.DeadlineExceeded
	}
	return d, ctx.Err()
}

// Apply proposes cmd, waits until it is committed and applied on this node,
// and returns the StateMachine's result and the entry's log index. It must be
// called on the leader. ctx's deadline bounds the wait; see the package
// documentation for what each error means for the command's fate. cmd must
// not be modified after the call.
func (n *Node) Apply(ctx context.Context, cmd []byte) (result any, index uint64, err error) {
	if n.closed.Load() {
		n.metrics.applyError(reasonClosed)
		return nil, 0, fmt.Errorf("raftlog: apply: %w", ErrClosed)
	}
	timeout, err := raftTimeout(ctx)
	if err != nil {
		n.metrics.applyError(reasonNotSubmitted)
		return nil, 0, fmt.Errorf("raftlog: apply: not submitted: %w", err)
	}
	start := time.Now()
	f := n.raft.Apply(cmd, timeout)
	err, completed := n.await(ctx, f)
	if !completed {
		reason := reasonUnknownOutcome
		if errors.Is(err, ErrClosed) {
			reason = reasonClosed
		}
		n.metrics.applyError(reason)
		return nil, 0, fmt.Errorf("raftlog: apply: %w: %w", ErrUnknownOutcome, err)
	}
	if err != nil {
		reason, err := n.applyErr(err)
		n.metrics.applyError(reason)
		return nil, 0, err
	}
	n.metrics.applyLatency.Observe(time.Since(start).Seconds())
	return f.Response(), f.Index(), nil
}

// applyErr maps an error of a completed raft apply future.
func (n *Node) applyErr(err error) (reason string, _ error) {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return reasonNotLeader, fmt.Errorf("raftlog: apply: %w (%w)", ErrNotLeader, err)
	case errors.Is(err, raft.ErrLeadershipLost):
		return reasonLeadershipLost, fmt.Errorf("raftlog: apply: %w: %w (%w)", ErrLeadershipLost, ErrUnknownOutcome, err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return reasonNotSubmitted, fmt.Errorf("raftlog: apply: not submitted: %w (%w)", context.DeadlineExceeded, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return reasonClosed, fmt.Errorf("raftlog: apply: %w (%w)", ErrClosed, err)
	default:
		return reasonOther, fmt.Errorf("raftlog: apply: %w", err)
	}
}

// leaderErr maps errors of leader-only operations other than Apply, where an
// unknown outcome is not a concern (reads, membership changes are retried).
func leaderErr(op string, err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("raftlog: %s: %w (%w)", op, ErrNotLeader, err)
	case errors.Is(err, raft.ErrLeadershipLost):
		return fmt.Errorf("raftlog: %s: %w (%w)", op, ErrLeadershipLost, err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("raftlog: %s: %w (%w)", op, context.DeadlineExceeded, err)
	case errors.Is(err, raft.ErrRaftShutdown), errors.Is(err, ErrClosed):
		return fmt.Errorf("raftlog: %s: %w", op, ErrClosed)
	default:
		return fmt.Errorf("raftlog: %s: %w", op, err)
	}
}

// ConsistentRead is a linearizable read barrier (Raft's read-index). It
// confirms that this node is still the leader with a heartbeat round to a
// quorum, and waits until the StateMachine has applied everything committed
// when the call started. A read of the local state after it returns reflects
// every write acknowledged before the call. It returns the commit index it
// waited for; ErrNotLeader on followers.
func (n *Node) ConsistentRead(ctx context.Context) (uint64, error) {
	if n.closed.Load() {
		return 0, fmt.Errorf("raftlog: consistent read: %w", ErrClosed)
	}
	if n.raft.State() != raft.Leader {
		return 0, fmt.Errorf("raftlog: consistent read: %w", ErrNotLeader)
	}
	term := n.raft.CurrentTerm()
	// A new leader's commit index may lag behind entries committed by its
	// predecessor until it commits an entry of its own term. Its no-op entry
	// does that shortly after the election; a barrier, once per term, lets us
	// know for sure.
	if n.readyTerm.Load() != term {
		timeout, err := raftTimeout(ctx)
		if err != nil {
			return 0, fmt.Errorf("raftlog: consistent read: %w", err)
		}
		if err, _ := n.await(ctx, n.raft.Barrier(timeout)); err != nil {
			return 0, leaderErr("consistent read", err)
		}
		if n.raft.CurrentTerm() != term {
			return 0, fmt.Errorf("raftlog: consistent read: %w (term changed)", ErrLeadershipLost)
		}
		n.readyTerm.Store(term)
	}
	index := n.raft.CommitIndex()
	if err, _ := n.await(ctx, n.raft.VerifyLeader()); err != nil {
		return 0, leaderErr("consistent read", err)
	}
	// Still leader of the same term: leadership within a term is contiguous,
	// so we were the leader, with the term's first entry committed, when we
	// read the commit index.
	if n.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("raftlog: consistent read: %w (term changed)", ErrLeadershipLost)
	}
	if err := n.WaitApplied(ctx, index); err != nil {
		return 0, fmt.Errorf("raftlog: consistent read: %w", err)
	}
	return index, nil
}

// WaitApplied blocks until the StateMachine reflects every log entry up to
// index (or ctx ends, or the node closes). It works on any node, e.g. to make
// a follower's reads monotonic after a write acknowledged elsewhere.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	target := index
	resolved := false
	var poll *time.Ticker
	defer func() {
		if poll != nil {
			poll.Stop()
		}
	}()
	for {
		if n.closed.Load() {
			return fmt.Errorf("raftlog: wait applied: %w", ErrClosed)
		}
		changed := n.fsm.changed()
		applied := n.fsm.applied.Load()
		if applied >= target {
			return nil
		}
		// raft hands only commands and configuration entries to the FSM, so
		// the applied index stops short of trailing no-op or barrier entries.
		// Once index is committed (hence immutable), find the last entry at
		// or below it that the FSM will see, and wait for that one instead.
		if !resolved && n.raft.CommitIndex() >= index {
			t, err := n.lastFSMEntry(index, applied)
			if err != nil {
				return fmt.Errorf("raftlog: wait applied: %w", err)
			}
			target, resolved = t, true
			continue
		}
		var tick <-chan time.Time
		if !resolved {
			// The commit index advances without the FSM being told (e.g. the
			// new leader's no-op); poll for it.
			if poll == nil {
				poll = time.NewTicker(10 * time.Millisecond)
			}
			tick = poll.C
		}
		select {
		case <-changed:
		case <-tick:
		case <-ctx.Done():
			return fmt.Errorf("raftlog: wait applied %d (applied %d): %w", index, applied, ctx.Err())
		case <-n.closing:
			return fmt.Errorf("raftlog: wait applied: %w", ErrClosed)
		}
	}
}

// lastFSMEntry returns the highest index in (applied, index] of an entry that
// raft passes to the FSM, or applied if there is none. Entries missing from
// the log were compacted into a snapshot the FSM already reflects.
func (n *Node) lastFSMEntry(index, applied uint64) (uint64, error) {
	for i := index; i > applied; i-- {
		var l raft.Log
		if err := n.logs.GetLog(i, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				return applied, nil
			}
			return 0, fmt.Errorf("read log entry %d: %w", i, err)
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return i, nil
		}
	}
	return applied, nil
}

// AppliedIndex is the index of the last log entry the StateMachine has
// applied (commands and configuration entries; it does not move for no-op or
// barrier entries), so it is at least the index passed to the last
// StateMachine.Apply or Restore.
func (n *Node) AppliedIndex() uint64 { return n.fsm.applied.Load() }

// IsLeader tells whether this node currently believes it is the leader. Use
// ConsistentRead when that belief must be confirmed.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the current leader's ID and Raft address as known to this
// node, or empty strings when no leader is known.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// ID returns this node's server ID.
func (n *Node) ID() string { return n.id }

// Addr returns the Raft address this node listens on and advertises (the
// real port when Config.RaftAddr asked for port 0).
func (n *Node) Addr() string { return n.addr }

// Status is a snapshot of a node's Raft view, for /cluster/status and tests.
type Status struct {
	ID                string
	Addr              string
	Role              string // "leader", "follower", "candidate" or "shutdown"
	LeaderID          string
	LeaderAddr        string
	Servers           []Server // latest configuration (possibly not yet committed)
	Term              uint64
	CommitIndex       uint64
	AppliedIndex      uint64 // as AppliedIndex()
	LastIndex         uint64 // last entry in the log or snapshot
	LastSnapshotIndex uint64
}

func roleName(s raft.RaftState) string {
	return strings.ToLower(s.String())
}

// Status returns the node's current Raft view. It does not block on raft's
// main loop.
func (n *Node) Status() Status {
	lid, laddr := n.Leader()
	st := Status{
		ID:           n.id,
		Addr:         n.addr,
		Role:         roleName(n.raft.State()),
		LeaderID:     lid,
		LeaderAddr:   laddr,
		Servers:      n.servers(),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.fsm.applied.Load(),
		LastIndex:    n.raft.LastIndex(),
	}
	st.LastSnapshotIndex, _ = strconv.ParseUint(n.raft.Stats()["last_snapshot_index"], 10, 64)
	return st
}

func (n *Node) servers() []Server {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		out = append(out, Server{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out
}

// AddVoter adds a voting member, or updates its address. It is idempotent:
// a server already present as a voter with the same address is left alone.
// It returns once the configuration change is committed, not once the new
// server has caught up. ErrNotLeader on followers.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	if n.closed.Load() {
		return fmt.Errorf("raftlog: add voter: %w", ErrClosed)
	}
	if id == "" || addr == "" {
		return errors.New("raftlog: add voter: id and addr are required")
	}
	if n.raft.State() != raft.Leader {
		return fmt.Errorf("raftlog: add voter %s: %w", id, ErrNotLeader)
	}
	for _, s := range n.servers() {
		if s.ID == id && s.Address == addr && s.Voter {
			return nil
		}
	}
	timeout, err := raftTimeout(ctx)
	if err != nil {
		return fmt.Errorf("raftlog: add voter %s: %w", id, err)
	}
	if err, _ := n.await(ctx, n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout)); err != nil {
		return leaderErr("add voter "+id, err)
	}
	n.logger.Info("added raft voter", "server_id", id, "server_addr", addr)
	return nil
}

// RemoveServer removes a member from the configuration. It is idempotent: an
// unknown id is not an error. Removing the leader itself makes it step down
// (it then stays a follower outside the cluster). ErrNotLeader on followers.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if n.closed.Load() {
		return fmt.Errorf("raftlog: remove server: %w", ErrClosed)
	}
	if n.raft.State() != raft.Leader {
		return fmt.Errorf("raftlog: remove server %s: %w", id, ErrNotLeader)
	}
	found := false
	for _, s := range n.servers() {
		if s.ID == id {
			found = true
			break
		}
	}
	if !found {
		return nil
	}
	timeout, err := raftTimeout(ctx)
	if err != nil {
		return fmt.Errorf("raftlog: remove server %s: %w", id, err)
	}
	if err, _ := n.await(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, timeout)); err != nil {
		return leaderErr("remove server "+id, err)
	}
	n.logger.Info("removed raft server", "server_id", id)
	return nil
}

// TakeSnapshot snapshots the state now and compacts the log (keeping
// TrailingLogs entries). Having nothing new to snapshot is not an error.
func (n *Node) TakeSnapshot() error {
	if n.closed.Load() {
		return fmt.Errorf("raftlog: snapshot: %w", ErrClosed)
	}
	if err := n.raft.Snapshot().Error(); err != nil {
		if errors.Is(err, raft.ErrNothingNewToSnapshot) {
			return nil
		}
		return fmt.Errorf("raftlog: snapshot: %w", err)
	}
	return nil
}

// Close shuts raft down and closes the transport and the stores. Calls in
// flight return errors matching ErrClosed (Apply: ErrUnknownOutcome, as the
// command may have been replicated). It is idempotent and returns the first
// call's result every time.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.closed.Store(true)
		close(n.closing)
		var errs []error
		// Shutdown also closes the transport (and with it the listener).
		if err := n.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("shutdown raft: %w", err))
		}
		n.raft.DeregisterObserver(n.observer)
		<-n.obsDone
		if err := n.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
		n.metrics.unregister()
		if err := errors.Join(errs...); err != nil {
			n.closeErr = fmt.Errorf("raftlog: close: %w", err)
		}
		n.logger.Info("raft node closed")
	})
	return n.closeErr
}
