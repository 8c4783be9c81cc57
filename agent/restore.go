package agent

// Following a restore of the masters' table (api.Restore): the history
// before it must not come back through peers that have not followed it yet.

import (
	"errors"
	"fmt"

	"github.com/carve-net/carve/agent/membership"
)

// refusedBeforeRestore is the reason of carve_agent_gossip_refused_total
// for a record or tombstone of the history before a restore.
const refusedBeforeRestore = "before_restore"

// errBeforeRestore marks a record or tombstone of the masters' history
// before a restore this agent followed.
var errBeforeRestore = errors.New("of the masters' history before the restore this agent followed")

// highestVersion is the highest version of a record or tombstone in st.
func highestVersion(st membership.State) uint64 {
	var v uint64
	for _, r := range st.Records {
		v = max(v, r.Version)
	}
	for _, t := range st.Tombstones {
		v = max(v, t.Version)
	}
	return v
}

// dropBeforeRestore takes out of a gossiped state the records and
// tombstones at or below floor (the highest version the agent knew when it
// followed a restore) that members does not hold: they are of the history
// before the restore, which a peer that has not followed it yet still
// gossips. A restore onto new masters starts its versions low again: its
// own records and tombstones come from the masters' state, not from gossip,
// until the masters' index passes the floor.
func dropBeforeRestore(st membership.State, floor uint64, members *membership.Membership) (membership.State, []membership.Refusal) {
	if floor == 0 {
		return st, nil
	}
	var out membership.State
	var refused []membership.Refusal
	for i := range st.Records {
		r := &st.Records[i]
		if r.Version <= floor && !members.Holds(r) {
			refused = append(refused, membership.Refusal{Reason: refusedBeforeRestore, Err: fmt.Errorf("record of agent %q version %d: %w", r.ID, r.Version, errBeforeRestore)})
			continue
		}
		out.Records = append(out.Records, *r)
	}
	for _, t := range st.Tombstones {
		if t.Version <= floor {
			if cur, ok := members.Tombstone(t.AgentID); !ok || cur != t.Version {
				refused = append(refused, membership.Refusal{Reason: refusedBeforeRestore, Err: fmt.Errorf("tombstone of agent %q version %d: %w", t.AgentID, t.Version, errBeforeRestore)})
				continue
			}
		}
		out.Tombstones = append(out.Tombstones, t)
	}
	return out, refused
}
