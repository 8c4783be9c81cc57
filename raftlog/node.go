package raftlog

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// Storage of a node's data directory.
const (
	// snapshotRetain is how many snapshots FileSnapshotStore keeps.
	snapshotRetain = 2
	// logCacheSize is how many recent entries are kept in memory so that
	// replication to followers does not read them back from bolt.
	logCacheSize = 2048
	// boltOpenTimeout bounds the wait for the data directory's file lock, so
	// that a second process on the same directory fails instead of hanging.
	boltOpenTimeout = 5 * time.Second
	// raftDBFile is the single bolt file holding both log and stable store.
	raftDBFile = "raft.db"
)

// Node is a running Raft member. All methods are safe for concurrent use.
type Node struct {
	id     string
	addr   string
	cfg    Config
	logger *slog.Logger

	raft    *raft.Raft
	fsm     *fsmAdapter
	store   *raftboltdb.BoltStore
	stable  *stableStore  // store, as raft writes its term and vote
	history *historyGuard // the log's history and the peers refused for another (history.go)
	logs    raft.LogStore // store behind an in-memory cache of recent entries
	trans   *commitObservingTransport
	metrics *nodeMetrics

	catchUp   *catchUp
	stopWatch context.CancelFunc // ends the goroutines Open started

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

	caught := newCatchUp()
	metrics := newNodeMetrics(cfg.Registerer)
	// The history as this node last knew it, before anything is replayed
	// or any peer is heard (history.go); incoming handshakes wait until
	// Open has restored the state machine, which may name it.
	history := newHistoryGuard(logger, metrics.historyRefused)
	history.load(readHistory(store))
	defer history.markReady()
	trans, err := newTransport(cfg, logger, metrics.tlsFailures, history, caught.leaderCommit)
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
	fsm.history = history
	n := &Node{
		id:       cfg.ID,
		addr:     addr,
		cfg:      cfg,
		logger:   logger,
		fsm:      fsm,
		store:    store,
		stable:   &stableStore{store: store},
		logs:     logs,
		trans:    trans,
		metrics:  metrics,
		obsCh:    make(chan raft.Observation, 64),
		obsDone:  make(chan struct{}),
		leaderCh: make(chan struct{}, 1),
		subs:     map[chan struct{}]struct{}{},
		closing:  make(chan struct{}),
		catchUp:  caught,
		history:  history,
	}
	history.persist = func(h string) error { return n.stable.Set([]byte(historyKey), []byte(h)) }
	history.changed = func() { trans.stream.live.closeWhere(func(*x509.Certificate) bool { return true }) }

	r, err := raft.NewRaft(cfg.raftConfig(logger), fsm, logs, n.stable, snaps, trans)
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
			"last_index", r.LastIndex(), "snapshot_applied_index", fsm.applied.Load(), "history", history.get())
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
	watchCtx, stopWatch := context.WithCancel(context.Background())
	n.stopWatch = stopWatch
	go n.watchCatchUp(watchCtx)
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

// ID returns this node's server ID.
func (n *Node) ID() string { return n.id }

// Addr returns the Raft address this node listens on and advertises (the
// real port when Config.RaftAddr asked for port 0).
func (n *Node) Addr() string { return n.addr }

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
		n.stopWatch()
		<-n.catchUp.stopped
		var errs []error
		// Shutdown also closes the transport (and with it the listener).
		if err := n.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("shutdown raft: %w", err))
		}
		n.raft.DeregisterObserver(n.observer)
		<-n.obsDone
		if err := n.stable.close(n.store.Close); err != nil {
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
