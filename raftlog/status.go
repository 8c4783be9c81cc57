package raftlog

import (
	"strconv"
	"strings"

	"github.com/hashicorp/raft"
)

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
	CaughtUp          bool // as IsCaughtUp()
	// History and HistoryConflict are as History() and HistoryConflict().
	History         string
	HistoryConflict string
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
		CaughtUp:     n.IsCaughtUp(),

		History:         n.History(),
		HistoryConflict: n.HistoryConflict(),
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
