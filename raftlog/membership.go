package raftlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

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
