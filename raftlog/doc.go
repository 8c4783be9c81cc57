// Package raftlog is a generic replicated log: a hashicorp/raft node with
// raft-boltdb storage, file snapshots and a TCP transport, driving an
// application StateMachine. It knows nothing about what the commands mean.
//
// # Life cycle
//
// Open starts a node from its data directory. A node with no Raft state that
// finds itself in Config.Peers bootstraps the cluster with exactly that list;
// every member is started with the same list, so whichever of them bootstraps
// first, they agree. A node with existing state never bootstraps again, and a
// node outside Peers waits to be added by the leader (Node.AddVoter).
//
// On start-up raft restores the latest snapshot into the StateMachine, but it
// replays the log entries after it only once it learns the commit index from a
// leader (or wins an election). Right after Open the state may therefore be
// behind; use WaitApplied or ConsistentRead before serving reads that must
// reflect earlier writes. CaughtUp tells when the node has applied everything
// the cluster had committed when it first heard from a leader after Open: a
// node restarted without quorum never gets there, so it must not present its
// state as the cluster's.
//
// # Histories
//
// A log bootstrapped again (a whole-cluster restore) reuses the indexes and
// terms of the log before it, which raft's log matching cannot tell apart. A
// StateMachine that implements HistoryReporter names its log; the node keeps
// the name in its stable store and, with TLS, the transport refuses peers of
// another history in the handshake, both ways (history.go).
//
// # Writes
//
// Node.Apply may be called from any number of goroutines. Commands queue in
// raft's buffered apply channel and are written and replicated in groups of up
// to Config.MaxAppendEntries, so concurrent callers share fsyncs and RPCs, and
// they are handed to the StateMachine in batches on raft's FSM goroutine.
//
// Error semantics of Apply:
//   - nil: the command is committed and was applied at the returned index.
//   - ErrNotLeader: the command was surely not applied (this node is not the
//     leader, or a leadership transfer is in progress); retry on the leader.
//   - ErrUnknownOutcome: the command was handed to raft but no answer came
//     back (leadership lost while in flight, ctx ended, or Close). It may or
//     may not be applied: commands should be idempotent, or the caller should
//     check the state. Leadership loss additionally matches ErrLeadershipLost,
//     Close additionally matches ErrClosed, and an ended ctx additionally
//     matches ctx.Err().
//   - an error matching context.DeadlineExceeded or context.Canceled but not
//     ErrUnknownOutcome: ctx ended before the command was handed to raft; it
//     was not applied.
//   - ErrClosed alone: the node was closed before the call.
//
// # Transport security
//
// With Config.TLS the transport speaks TLS both ways (carve's masters use
// mutual TLS with certificates of role master): an accepted connection
// does its handshake, bounded by the transport timeout, in raft's own
// goroutine for that connection, and a dialed one before raft uses it. A
// failed handshake closes the connection, is logged, and counts in
// carve_raft_tls_handshake_failures_total{direction="incoming|outgoing"}.
//
// # Snapshot format
//
// A snapshot file (raft's FileSnapshotStore, which adds its own CRC) holds a
// 16-byte header followed by whatever Snapshot.WriteTo wrote: the magic
// "CRVS", a big-endian uint32 format version (1) and a big-endian uint64, the
// last log index whose effects the state contains. That index is what
// StateMachine.Restore receives.
package raftlog
