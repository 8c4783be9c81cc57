package raftlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

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
