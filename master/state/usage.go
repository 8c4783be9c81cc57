package state

import (
	"fmt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/usage"
)

// RecordUsage keeps an agent's usage report and, when the report is
// complete (StateIndex set) and every block in it is the agent's at the
// masters, acknowledges its holdings up to min(StateIndex, the state
// index). It changes no record.
func (t *LeaseTable) RecordUsage(id string, r *api.UsageReport) (api.UsageAnswer, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	rec := t.agents[id]
	if rec == nil {
		return api.UsageAnswer{}, fmt.Errorf("%w %q", ErrUnknownAgent, id)
	}
	var ans api.UsageAnswer
	for _, ov := range r.Overlays {
		for _, b := range ov.Blocks {
			p, _ := netconfig.CanonicalPrefix(b.Prefix) // validated
			if !rec.Leases[ov.Name].Covers(p) {
				ans.Unknown = append(ans.Unknown, ov.Name+":"+b.Prefix)
			}
		}
	}
	t.usage.Record(id, rec.Created, r)
	if r.StateIndex > 0 && len(ans.Unknown) == 0 {
		ans.Acknowledged = t.usage.Acknowledge(id, usage.Ack{Created: rec.Created, Index: min(r.StateIndex, t.stateIndex)})
	}
	return ans, nil
}

// ReleaseProposal returns the release command the leader may propose: the
// acknowledgements it holds, when quarantined space exists that they
// release. false when there is nothing to release.
func (t *LeaseTable) ReleaseProposal() (logcmd.Command, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if len(t.quarantine) == 0 {
		return logcmd.Command{}, false
	}
	held := t.usage.Acks()
	acks := map[string]logcmd.HoldingsAck{}
	floor := ^uint64(0)
	for id, rec := range t.agents {
		a, ok := held[id]
		if !ok || a.Created != rec.Created {
			return logcmd.Command{}, false
		}
		acks[id] = logcmd.HoldingsAck{Created: a.Created, Index: a.Index}
		floor = min(floor, a.Index)
	}
	for _, qs := range t.quarantine {
		for _, q := range qs {
			if q.Since <= floor {
				return logcmd.ReleaseCommand(acks), true
			}
		}
	}
	return logcmd.Command{}, false
}

// QuarantinedCount is the number of quarantined blocks (metrics).
func (t *LeaseTable) QuarantinedCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, qs := range t.quarantine {
		n += len(qs)
	}
	return n
}
