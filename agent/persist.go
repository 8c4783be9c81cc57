package agent

// What the agent keeps across restarts: the loop that saves it to the
// store, and the membership taken back from it at start.

import (
	"context"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/agent/store"
)

// persistLoop writes the state whenever it changed (coalesced).
func (a *Agent) persistLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.persistCh:
			a.save("persist agent state")
		}
	}
}

// save writes the state, unless the agent refuses the masters' records:
// what it holds then lacks what it refused (saved records that no longer
// verify among them), and the disk keeps what it verified last, for a
// restart with the key that verifies it (verify.go).
func (a *Agent) save(what string) {
	if why := a.refusingNow(); why != "" {
		a.log.Debug("not saving the state while refusing the masters' records", "why", why)
		return
	}
	if err := a.store.Save(a.snapshot()); err != nil {
		a.log.Error(what, "err", err)
	}
}

func (a *Agent) snapshot() store.State {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return store.State{ID: a.id, Self: a.self, Network: a.network, Membership: a.members.State(),
		MasterIndex: a.masterIndex, ClusterID: a.clusterID, RestoreEpoch: a.restoreEpoch, RestoreFloor: a.restoreFloor, SigningKey: a.signingKey, FromMasters: a.members.FromMasters(),
		Horizon: a.members.Horizon()}
}

// loadMembership merges the persisted membership, checked as gossip is:
// the store holds what was verified, unless it was written by a version
// of the agent that kept no signatures, or with another key. It returns
// what it refused.
func (a *Agent) loadMembership(p store.State) []membership.Refusal {
	tr := a.trustLocked()
	if tr.ClusterID == "" {
		tr.Required = false // nothing of a cluster yet; nothing persisted either
	}
	in, refused := tr.Admit(tr.ClusterID, p.Membership, a.members)
	if len(refused) > 0 {
		a.log.Warn("dropped persisted records that do not pass the checks; the masters or gossip will bring them again",
			"dropped", len(refused), "first", refused[0].Err)
	}
	masters := map[string]bool{}
	for _, id := range p.FromMasters {
		masters[id] = true
	}
	var fromMasters, other membership.State
	fromMasters.Tombstones = in.Tombstones
	for _, r := range in.Records {
		if masters[r.ID] {
			fromMasters.Records = append(fromMasters.Records, r)
		} else {
			other.Records = append(other.Records, r)
		}
	}
	a.members.Compact(p.Horizon)
	a.members.MergeFromMasters(fromMasters)
	a.members.Merge(other)
	return refused
}
