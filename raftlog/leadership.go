package raftlog

import (
	"sync"

	"github.com/hashicorp/raft"
)

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

// IsLeader tells whether this node currently believes it is the leader. Use
// ConsistentRead when that belief must be confirmed.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the current leader's ID and Raft address as known to this
// node, or empty strings when no leader is known.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}
