package raftlog

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
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
	// TLS, when set, runs the transport over TLS; nil means plain TCP.
	TLS *TransportTLS

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

// TransportTLS secures the Raft transport. Both sides of every connection
// are Raft nodes, so it is meant to be mutual: Server should require and
// verify client certificates, and Client should present one. A connection
// whose handshake fails is closed, logged and counted
// (carve_raft_tls_handshake_failures_total).
type TransportTLS struct {
	// Server answers incoming connections.
	Server *tls.Config
	// Client dials the peers; its ServerName is set to each peer's host,
	// so a peer's certificate must name the address it advertises.
	Client *tls.Config
	// Refresh, if set, updates a clone of Client before each dial (the
	// CA and certificate files as last loaded: pki.Reloader.Refresh).
	Refresh func(*tls.Config) *tls.Config
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
	if cfg.TLS != nil && (cfg.TLS.Server == nil || cfg.TLS.Client == nil) {
		return cfg, errors.New("raftlog: config: TLS needs both a Server and a Client configuration")
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
