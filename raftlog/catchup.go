package raftlog

import (
	"context"
	"sync/atomic"

	"github.com/carve-net/carve/internal/retry"
)

// catchUp tracks whether a node has caught up with the cluster since Open.
// Until it has, its StateMachine may be older than what the cluster already
// acknowledged: a node restarted alone holds its snapshot and none of the
// log after it, and a node that lost its disk holds nothing at all.
type catchUp struct {
	// firstCommit is the first commit index a leader sent this node after
	// Open (0 until then); heard is closed when it is set.
	firstCommit atomic.Uint64
	heard       chan struct{}
	// done is closed once the node has caught up; it stays closed.
	done chan struct{}
	// stopped is closed when the watcher goroutine has returned.
	stopped chan struct{}
}

func newCatchUp() *catchUp {
	return &catchUp{heard: make(chan struct{}), done: make(chan struct{}), stopped: make(chan struct{})}
}

// leaderCommit notes a commit index a leader sent; only the first counts.
func (c *catchUp) leaderCommit(index uint64) {
	if index > 0 && c.firstCommit.CompareAndSwap(0, index) {
		close(c.heard)
	}
}

// CaughtUp returns a channel closed once this node's StateMachine reflects
// everything the cluster had committed when the node first heard from a
// leader after Open; on a leader, once it has committed an entry of its own
// term and applied everything before it. It never reopens: later a follower
// may fall behind again, but only by what it has not heard of yet, never
// back to a state older than one it could have served. Until then, serve
// nothing from the state as if it were the cluster's.
func (n *Node) CaughtUp() <-chan struct{} { return n.catchUp.done }

// IsCaughtUp tells whether CaughtUp is closed.
func (n *Node) IsCaughtUp() bool {
	select {
	case <-n.catchUp.done:
		return true
	default:
		return false
	}
}

// watchCatchUp closes CaughtUp when the node has caught up (or returns when
// ctx ends at Close).
func (n *Node) watchCatchUp(ctx context.Context) {
	defer close(n.catchUp.stopped)
	changes, cancel := n.Subscribe()
	defer cancel()
	for {
		ok, err := n.tryCatchUp(ctx)
		if ok {
			close(n.catchUp.done)
			n.logger.Info("caught up with the cluster", "applied_index", n.AppliedIndex(), "leader_commit_index", n.catchUp.firstCommit.Load())
			return
		}
		if err != nil {
			n.logger.Debug("not caught up yet", "err", err)
			if !retry.Sleep(ctx, n.cfg.HeartbeatTimeout) {
				return
			}
			continue
		}
		select {
		case <-changes:
		case <-n.catchUp.heard:
		case <-ctx.Done():
			return
		}
	}
}

// tryCatchUp waits until the node has applied what a leader told it is
// committed, or, as leader, until a read barrier passes. false with a nil
// error means no leader has been heard of yet.
func (n *Node) tryCatchUp(ctx context.Context) (bool, error) {
	if n.IsLeader() {
		rctx, cancel := context.WithTimeout(ctx, 10*n.cfg.HeartbeatTimeout)
		defer cancel()
		if _, err := n.ConsistentRead(rctx); err != nil {
			return false, err
		}
		return true, nil
	}
	target := n.catchUp.firstCommit.Load()
	if target == 0 {
		return false, nil
	}
	if err := n.WaitApplied(ctx, target); err != nil {
		return false, err
	}
	return true, nil
}
