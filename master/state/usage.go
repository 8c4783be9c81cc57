package state

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/prefixspace"
)

// Bounds of a usage report.
const (
	maxUsageOverlays = 64
	maxUsageBlocks   = 4096
)

// usageTable keeps what agents last reported of their blocks (used and
// free counts) and the holdings acknowledgements their complete reports
// gave. It is not replicated: usage is informational, and the leader that
// receives the reports (followers forward them) is the one that proposes
// quarantine releases from the acknowledgements. An acknowledgement stays
// true once given (see docs/design.md), so a master that leads again may
// use the ones it kept.
type usageTable struct {
	mu     sync.Mutex
	gen    uint64 // sum of the agents' generations: changes with any of them
	agents map[string]agentUsage
	acks   map[string]holdingsAck
	live   liveness
}

type agentUsage struct {
	created uint64
	gen     uint64 // changes when the counts change (state cache)
	blocks  map[string]map[string]api.BlockUsage
}

func newUsageTable() *usageTable {
	return &usageTable{agents: map[string]agentUsage{}, acks: map[string]holdingsAck{}, live: newLiveness()}
}

// generation changes whenever any agent's usage does.
func (u *usageTable) generation() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gen
}

// usageGen is the generation of an agent's usage (0: none), for the cache.
func (u *usageTable) usageGen(id string, created uint64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	gen := u.live.gens[id] // the liveness shown changes the encoding too
	a, ok := u.agents[id]
	if !ok || a.created != created {
		return gen
	}
	return gen + a.gen
}

// fill sets the used and free counts of info's blocks that the agent
// (record created at created) reported.
func (u *usageTable) fill(info *api.AgentInfo, created uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.fillSilence(info)
	a, ok := u.agents[info.AgentID]
	if !ok || a.created != created {
		return
	}
	for i := range info.Overlays {
		ov := &info.Overlays[i]
		byPrefix := a.blocks[ov.Info.Name]
		for j := range ov.Blocks {
			if bu, ok := byPrefix[ov.Blocks[j].Prefix]; ok {
				used, free := bu.Used, bu.Free
				ov.Blocks[j].Used, ov.Blocks[j].Free = &used, &free
			}
		}
	}
}

// ValidateUsage checks a usage report and names the bad field.
func ValidateUsage(r *api.UsageReport) error {
	if len(r.Overlays) > maxUsageOverlays {
		return fmt.Errorf("overlays: at most %d", maxUsageOverlays)
	}
	n := 0
	seen := map[string]bool{}
	for i, ov := range r.Overlays {
		if err := api.ValidateOverlayName(ov.Name); err != nil {
			return fmt.Errorf("overlays[%d].name: %w", i, err)
		}
		if seen[ov.Name] {
			return fmt.Errorf("overlays[%d].name: %q twice", i, ov.Name)
		}
		seen[ov.Name] = true
		for j, b := range ov.Blocks {
			if n++; n > maxUsageBlocks {
				return fmt.Errorf("overlays: at most %d blocks in all", maxUsageBlocks)
			}
			if _, err := netconfig.CanonicalPrefix(b.Prefix); err != nil {
				return fmt.Errorf("overlays[%d].blocks[%d].prefix: %w", i, j, err)
			}
		}
	}
	return nil
}

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
	blocks := map[string]map[string]api.BlockUsage{}
	for _, ov := range r.Overlays {
		byPrefix := map[string]api.BlockUsage{}
		for _, b := range ov.Blocks {
			byPrefix[b.Prefix] = b
			p, _ := netconfig.CanonicalPrefix(b.Prefix) // validated
			if !holds(rec.Leases[ov.Name].Blocks, p) {
				ans.Unknown = append(ans.Unknown, ov.Name+":"+b.Prefix)
			}
		}
		blocks[ov.Name] = byPrefix
	}
	t.usage.mu.Lock()
	defer t.usage.mu.Unlock()
	prev := t.usage.agents[id]
	u := agentUsage{created: rec.Created, gen: prev.gen, blocks: blocks}
	if prev.created != rec.Created || !usageEqual(prev.blocks, blocks) {
		u.gen = prev.gen + 1
		t.usage.gen++
	}
	t.usage.agents[id] = u
	if r.StateIndex > 0 && len(ans.Unknown) == 0 {
		ack := holdingsAck{Created: rec.Created, Index: min(r.StateIndex, t.stateIndex)}
		if cur, ok := t.usage.acks[id]; !ok || cur.Created != ack.Created || cur.Index < ack.Index {
			t.usage.acks[id] = ack
		}
		ans.Acknowledged = t.usage.acks[id].Index
	}
	return ans, nil
}

func usageEqual(a, b map[string]map[string]api.BlockUsage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || len(x) != len(y) {
			return false
		}
		for p, v := range x {
			if y[p] != v {
				return false
			}
		}
	}
	return true
}

// holds reports whether the blocks cover all of p.
func holds(blocks []leaseBlock, p netip.Prefix) bool {
	for _, b := range blocks {
		if b.Prefix.Contains(p.Addr()) && b.Prefix.Bits() <= p.Bits() {
			return true
		}
	}
	// p may span several blocks: check that its pieces are all held.
	if p.Bits() >= p.Addr().BitLen() {
		return false
	}
	inside := false
	for _, b := range blocks {
		if p.Contains(b.Prefix.Addr()) && b.Prefix.Bits() > p.Bits() {
			inside = true
			break
		}
	}
	if !inside {
		return false
	}
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	return holds(blocks, lo) && holds(blocks, prefixspace.Sibling(lo))
}

// ReleaseProposal returns the release command the leader may propose: the
// acknowledgements it holds, when quarantined space exists that they
// release. false when there is nothing to release.
func (t *LeaseTable) ReleaseProposal() (Command, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if len(t.quarantine) == 0 {
		return Command{}, false
	}
	t.usage.mu.Lock()
	defer t.usage.mu.Unlock()
	acks := map[string]holdingsAck{}
	floor := ^uint64(0)
	for id, rec := range t.agents {
		a, ok := t.usage.acks[id]
		if !ok || a.Created != rec.Created {
			return Command{}, false
		}
		acks[id] = a
		floor = min(floor, a.Index)
	}
	for _, qs := range t.quarantine {
		for _, q := range qs {
			if q.Since <= floor {
				return Command{command{Op: opRelease, Release: &releaseCmd{Acks: acks}}}, true
			}
		}
	}
	return Command{}, false
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
