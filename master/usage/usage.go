// Package usage keeps what agents tell the leader outside the Raft log:
// the used and free address counts of their blocks (usage reports), the
// holdings acknowledgements their complete reports give, when each agent
// was last heard from and which agents are silent (liveness.go), and
// which CA issued the certificate each presents. None of it is
// replicated: usage is informational, and the leader, which receives the
// reports (followers forward them), is the one that judges silence and
// proposes quarantine releases from the acknowledgements. An
// acknowledgement stays true once given (see docs/design.md), so a master
// that leads again may use the ones it kept.
//
// It is a package of its own because it is bookkeeping beside the lease
// table, with its own lock, and no rule of the table's: it knows agents by
// id and by the index that created their record, imports nothing of ours
// but api and netconfig's prefix parsing (cmd/carve/deps_test.go keeps it
// so), and master/state asks it what to show (Fill) and what to propose
// (Acks).
package usage

import (
	"fmt"
	"maps"
	"net/netip"
	"sync"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// Bounds of a usage report.
const (
	maxUsageOverlays = 64
	maxUsageBlocks   = 4096
)

// Table is what agents last reported of their blocks, the holdings
// acknowledgements, and the agents' liveness. Safe for concurrent use.
type Table struct {
	mu     sync.Mutex
	gen    uint64 // sum of the agents' generations: changes with any of them
	agents map[string]agentUsage
	acks   map[string]Ack
	live   liveness
}

type agentUsage struct {
	created uint64
	gen     uint64 // changes when the counts change (state cache)
	blocks  map[string]map[string]api.BlockUsage
}

// Ack says that agent record Created reported, when it had merged the
// masters' state up to Index, every block it holds, and that the masters
// knew each of them as its own.
type Ack struct {
	Created uint64
	Index   uint64
}

// New returns an empty table.
func New() *Table {
	return &Table{agents: map[string]agentUsage{}, acks: map[string]Ack{}, live: newLiveness()}
}

// Generation changes whenever any agent's usage or liveness shown does.
func (u *Table) Generation() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gen
}

// AgentGeneration is the generation of what Fill shows of the agent whose
// record was created at created (0: nothing), for the caches of encoded
// records.
func (u *Table) AgentGeneration(id string, created uint64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	gen := u.live.gens[id] // the liveness shown changes the encoding too
	a, ok := u.agents[id]
	if !ok || a.created != created {
		return gen
	}
	return gen + a.gen
}

// Fill sets the used and free counts of info's blocks that the agent
// (record created at created) reported, and shows a silent agent's
// STATUS_OK overlays as STATUS_FAILED.
func (u *Table) Fill(info *api.AgentInfo, created uint64) {
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

// Validate checks a usage report and names the bad field.
func Validate(r *api.UsageReport) error {
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

// Record keeps the counts of a validated usage report of the agent whose
// record was created at created.
func (u *Table) Record(id string, created uint64, r *api.UsageReport) {
	blocks := map[string]map[string]api.BlockUsage{}
	for _, ov := range r.Overlays {
		byPrefix := map[string]api.BlockUsage{}
		for _, b := range ov.Blocks {
			byPrefix[b.Prefix] = b
		}
		blocks[ov.Name] = byPrefix
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	prev := u.agents[id]
	a := agentUsage{created: created, gen: prev.gen, blocks: blocks}
	if prev.created != created || !usageEqual(prev.blocks, blocks) {
		a.gen = prev.gen + 1
		u.gen++
	}
	u.agents[id] = a
}

// Acknowledge keeps ack as the agent's acknowledgement unless it holds a
// higher one of the same record, and returns the index acknowledged.
func (u *Table) Acknowledge(id string, ack Ack) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if cur, ok := u.acks[id]; !ok || cur.Created != ack.Created || cur.Index < ack.Index {
		u.acks[id] = ack
	}
	return u.acks[id].Index
}

// Acks returns a copy of the acknowledgements, by agent id.
func (u *Table) Acks() map[string]Ack {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.acks)
}

// ClearAcks forgets every acknowledgement (they are of a table a restore
// replaced).
func (u *Table) ClearAcks() {
	u.mu.Lock()
	defer u.mu.Unlock()
	clear(u.acks)
}

// FreeIn sums the free addresses that the agents holding the overlay's
// family (holders: id to record Created) reported in it; full is true when
// every holder reported and none has a free address.
func (u *Table) FreeIn(overlay string, is4 bool, holders map[string]uint64) (free uint64, full bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(holders) == 0 {
		return 0, false
	}
	for id, created := range holders {
		a, ok := u.agents[id]
		if !ok || a.created != created {
			return 0, false // not every holder has reported: not judged
		}
		for prefix, bu := range a.blocks[overlay] {
			if p, err := netip.ParsePrefix(prefix); err == nil && p.Addr().Is4() == is4 {
				free += bu.Free
			}
		}
	}
	return free, free == 0
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
