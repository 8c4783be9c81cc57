package raftlog

import (
	"errors"
)

var (
	// ErrNotLeader means the operation needs the leader and this node is not
	// it; for Apply it also guarantees that the command was not applied, so the
	// caller may safely forward or retry it elsewhere.
	ErrNotLeader = errors.New("raftlog: not the leader")

	// ErrLeadershipLost means this node lost the leadership while the
	// operation was in flight. For Apply the outcome is unknown (the error also
	// matches ErrUnknownOutcome): the entry may still be committed by the next
	// leader.
	ErrLeadershipLost = errors.New("raftlog: leadership lost")

	// ErrUnknownOutcome means an Apply was handed to raft but its result never
	// came back (leadership lost, ctx ended or the node was closed while it
	// was in flight): the command may or may not be applied.
	ErrUnknownOutcome = errors.New("raftlog: outcome unknown")

	// ErrClosed means the node has been closed; it will not serve any more
	// requests.
	ErrClosed = errors.New("raftlog: node closed")
)
