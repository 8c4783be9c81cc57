package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/prefixspace"
	"github.com/carve-net/carve/ring"
)

// checkTable checks the lease table's invariants: every agent's blocks lie
// inside its overlay; no two agents' blocks overlap, nor a block and a
// quarantined one; the allocators hold exactly the blocks of the records
// and the quarantine; and what they would hand out next is free.
func checkTable(t *testing.T, tb *LeaseTable) {
	t.Helper()
	if err := tb.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// growthModel is what the agents really hold: the masters' records plus
// the ring grants not reported yet.
type growthModel struct {
	unreported []modelGrant
	nextIP     int
}

type modelGrant struct {
	overlay          string
	prefix           netip.Prefix
	donor, recipient string
}

// trueHoldings is every agent's holdings: its blocks at the masters, less
// what it granted without reporting, plus what it received so.
func (m *growthModel) trueHoldings(tb *LeaseTable) map[string][]netip.Prefix {
	out := map[string][]netip.Prefix{}
	for id, rec := range tb.agents {
		for _, b := range rec.Leases["g"].Blocks {
			pieces := []netip.Prefix{b.Prefix}
			for _, g := range m.unreported {
				if g.donor != id {
					continue
				}
				var next []netip.Prefix
				for _, p := range pieces {
					for _, l := range cutOut(leaseBlock{Prefix: p}, g.prefix) {
						next = append(next, l.Prefix)
					}
				}
				pieces = next
			}
			out[id] = append(out[id], pieces...)
		}
	}
	for _, g := range m.unreported {
		if tb.agents[g.recipient] != nil {
			out[g.recipient] = append(out[g.recipient], g.prefix)
		}
	}
	return out
}

func (m *growthModel) check(tb *LeaseTable) error {
	if err := tb.CheckInvariants(); err != nil {
		return err
	}
	type owned struct {
		p  netip.Prefix
		id string
	}
	var all []owned
	for id, ps := range m.trueHoldings(tb) {
		for _, p := range ps {
			all = append(all, owned{p, id})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].p.Addr().Less(all[j].p.Addr()) })
	for i := 1; i < len(all); i++ {
		if all[i-1].p.Overlaps(all[i].p) {
			return fmt.Errorf("one-owner invariant broken: %s held by %s and %s held by %s (unreported grants %+v)",
				all[i-1].p, all[i-1].id, all[i].p, all[i].id, m.unreported)
		}
	}
	return nil
}

// TestGrowthInvariantProperty runs random histories of registrations,
// grows, ring grants (reported at once, later or never), returns, deletes,
// re-registrations, holdings acknowledgements and quarantine releases,
// snapshot/restore, restores of an earlier snapshot into the running table
// and config reloads on a real LeaseTable, and checks after every step
// that no address is held by two agents, counting the grants the masters
// have not heard of.
func TestGrowthInvariantProperty(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 8
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			if err := runGrowthHistory(t, seed, 250); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		})
	}
}

func runGrowthHistory(t *testing.T, seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	cfg := cfgWith(api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/21", Prefix: 24, Subnet6: "fd09::/61", Prefix6: 64})
	h := newHarness(t, cfg)
	m := &growthModel{}
	ids := []string{"a", "b", "c", "d", "e", "f"}
	live := func() []string { return slices.Sorted(maps.Keys(h.table.agents)) }
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	var history []string
	var saved [][]byte // snapshots for a later restore into the running table
	fail := func(format string, args ...any) error {
		return fmt.Errorf("step %d: %s\nhistory:\n%s", len(history), fmt.Sprintf(format, args...), joinLines(history))
	}
	for step := 0; step < steps; step++ {
		op := rng.IntN(14)
		agents := live()
		switch {
		case op <= 1 || len(agents) < 2: // register (new or again)
			id := pick(ids)
			m.nextIP++
			ip := netip.AddrFrom4([4]byte{198, 18, byte(m.nextIP >> 8), byte(m.nextIP)}).String()
			if old := h.table.agents[id]; old != nil {
				ip = old.IP.String()
			}
			res := h.register(id, ip, true, rng.IntN(2) == 0)
			history = append(history, fmt.Sprintf("register %s: %v", id, res.Err))
			if res.Err != nil {
				return fail("register %s: %v", id, res.Err)
			}
		case op == 2: // grow
			id, fam := pick(agents), 4+2*rng.IntN(2)
			res := h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: id, Overlay: "g", Bridge: api.BridgeMesos, Family: fam}})
			history = append(history, fmt.Sprintf("grow %s v%d: %v", id, fam, res.Err))
			if res.Err != nil && !errors.Is(res.Err, ErrOverlayExhausted) {
				return fail("grow: %v", res.Err)
			}
		case op == 3 || op == 4: // a ring grant, unreported for now
			donor, recip := pick(agents), pick(agents)
			if donor == recip {
				continue
			}
			holdings := m.trueHoldings(h.table)[donor]
			var candidates []netip.Prefix
			for _, p := range holdings {
				if m.grantedIn(donor, p) {
					continue // re-granting a grant the masters do not know: not modelled
				}
				candidates = append(candidates, p)
			}
			if len(candidates) == 0 {
				continue
			}
			p := candidates[rng.IntN(len(candidates))]
			bits := min(p.Bits()+rng.IntN(4), p.Addr().BitLen()-1)
			off := ring.U128(rng.Uint64N(1 << uint(bits-p.Bits()))).Lsh(uint(p.Addr().BitLen() - bits))
			g := netip.PrefixFrom(prefixspace.AddrPlus(p.Addr(), off), bits)
			m.unreported = append(m.unreported, modelGrant{overlay: "g", prefix: g, donor: donor, recipient: recip})
			history = append(history, fmt.Sprintf("ring grant %s %s -> %s", g, donor, recip))
		case op == 5 && len(m.unreported) > 0: // a grant reported
			i := rng.IntN(len(m.unreported))
			g := m.unreported[i]
			reporter := g.recipient
			res := h.apply(command{Op: opGrant, Grant: &grantCmd{Overlay: g.overlay, Prefix: g.prefix, Donor: g.donor, Recipient: g.recipient}})
			history = append(history, fmt.Sprintf("report grant %s %s -> %s by %s: %v", g.prefix, g.donor, g.recipient, reporter, res.Err))
			if res.Err != nil {
				return fail("report of a real grant refused: %v", res.Err)
			}
			m.unreported = slices.Delete(m.unreported, i, i+1)
		case op == 6: // return a grown or granted block (not one it granted from without reporting)
			id := pick(agents)
			var blocks []leaseBlock
			for _, b := range h.table.agents[id].Leases["g"].Blocks {
				if b.Origin != api.BlockLeased && !m.grantedFrom(id, b.Prefix) {
					blocks = append(blocks, b)
				}
			}
			if len(blocks) == 0 {
				continue
			}
			b := blocks[rng.IntN(len(blocks))]
			res := h.apply(command{Op: opReturn, Return: &returnCmd{AgentID: id, Overlay: "g", Prefix: b.Prefix}})
			history = append(history, fmt.Sprintf("return %s by %s: %v", b.Prefix, id, res.Err))
			if res.Err != nil {
				return fail("return: %v", res.Err)
			}
		case op == 7: // delete
			id := pick(agents)
			before := heldSnapshot(h.table)
			mine := h.table.agents[id].Leases
			res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{id}}})
			history = append(history, fmt.Sprintf("delete %s: %v", id, res.Err))
			// A deleted agent is gone: what it received unreported is
			// void (the ring's tombstone voids its tokens), and a later
			// agent of the same id does not hold it.
			m.unreported = slices.DeleteFunc(m.unreported, func(g modelGrant) bool { return g.recipient == id })
			if len(h.table.agents) > 0 {
				if err := checkDeleteFreedExactly(before, heldSnapshot(h.table), id, mine); err != nil {
					return fail("%v", err)
				}
			}
		case op == 8: // a complete usage report, from the agent's true holdings
			id := pick(agents)
			rep := &api.UsageReport{StateIndex: h.table.stateIndex}
			var bu []api.BlockUsage
			for _, p := range m.trueHoldings(h.table)[id] {
				bu = append(bu, api.BlockUsage{Prefix: p.String(), Free: 1})
			}
			rep.Overlays = []api.OverlayUsage{{Name: "g", Blocks: bu}}
			ans, err := h.table.RecordUsage(id, rep)
			history = append(history, fmt.Sprintf("usage %s: %+v %v", id, ans, err))
			if err != nil {
				return fail("usage: %v", err)
			}
			if cmd, ok := h.table.ReleaseProposal(); ok {
				res := h.apply(cmd)
				history = append(history, fmt.Sprintf("release: %d", res.Released))
			}
		case op == 9: // snapshot and restore into a new table
			snap, err := h.table.Snapshot()
			if err != nil {
				return fail("snapshot: %v", err)
			}
			var buf bytes.Buffer
			if _, err := snap.WriteTo(&buf); err != nil {
				return fail("write snapshot: %v", err)
			}
			before, _ := json.Marshal(h.table.State())
			restored := NewLeaseTable()
			if err := restored.Restore(h.index, &buf); err != nil {
				return fail("restore: %v", err)
			}
			restored.usage = h.table.usage // the leader's memory, not in snapshots
			after, _ := json.Marshal(restored.State())
			if !bytes.Equal(before, after) {
				return fail("restored state differs:\n%s\n%s", before, after)
			}
			h.table = restored
			history = append(history, "snapshot/restore")
		case op == 11: // a snapshot saved, for a restore later
			var buf bytes.Buffer
			if err := h.table.WriteSnapshot(&buf); err != nil {
				return fail("snapshot: %v", err)
			}
			saved = append(saved, buf.Bytes())
			history = append(history, fmt.Sprintf("snapshot saved #%d", len(saved)-1))
		case op == 12 && len(saved) > 0: // an earlier snapshot restored into the running table
			i := rng.IntN(len(saved))
			before := maps.Clone(h.table.agents) // records are immutable once stored
			res := h.apply(logcmd.RestoreCommand(saved[i], time.Unix(0, int64(step+1))))
			history = append(history, fmt.Sprintf("restore of snapshot #%d: %v", i, res.Err))
			if res.Err != nil {
				return fail("restore: %v", res.Err)
			}
			if err := checkRestoreKeptLive(h.table, before); err != nil {
				return fail("%v", err)
			}
			// An agent the restore deleted is gone, as after a delete:
			// what it received unreported is void. What it granted
			// unreported stays its recipient's where the restored table
			// leaves the space free: the quarantine of the deleted
			// agent's space must cover it, which this checks. A kept
			// donor keeps every block it was leased
			// (checkRestoreKeptLive), so its unreported grants
			// stand. The restore takes back the rest: space the restored
			// table gives an agent (its recipient isolates the addresses
			// it holds there, and hands none out). Those are no holdings
			// here.
			m.unreported = slices.DeleteFunc(m.unreported, func(g modelGrant) bool {
				if h.table.agents[g.recipient] == nil {
					return true
				}
				for id, rec := range h.table.agents {
					if id != g.donor && slices.ContainsFunc(rec.Leases["g"].Blocks, func(b leaseBlock) bool { return b.Prefix.Overlaps(g.prefix) }) {
						return true
					}
				}
				donor := h.table.agents[g.donor]
				return donor != nil && !slices.ContainsFunc(donor.Leases["g"].Blocks, func(b leaseBlock) bool {
					return b.Prefix.Contains(g.prefix.Addr()) && b.Prefix.Bits() <= g.prefix.Bits()
				})
			})
		case op == 10: // config reload: another grow size
			c := cfg
			c.Overlays = slices.Clone(cfg.Overlays)
			c.Overlays[0].GrowPrefix = 24 + rng.IntN(4)
			res := h.apply(command{Op: opSetConfig, SetConfig: &c})
			history = append(history, fmt.Sprintf("config grow_prefix %d: %v", c.Overlays[0].GrowPrefix, res.Err))
			if res.Err != nil {
				return fail("config: %v", res.Err)
			}
		default: // a grant reported at once
			continue
		}
		if err := m.check(h.table); err != nil {
			return fail("%v", err)
		}
	}
	return nil
}

// checkRestoreKeptLive checks that a restore took from no agent it kept
// any space the table before leased it: all of it is still the agent's,
// whatever the snapshot said of it.
func checkRestoreKeptLive(tb *LeaseTable, before map[string]*agentRecord) error {
	for id, old := range before {
		if tb.agents[id] == nil {
			continue
		}
		if _, ok := tb.agents[id].Leases["g"]; !ok {
			continue
		}
		for _, b := range old.Leases["g"].Blocks {
			space := tb.spaces["g"].family(b.Prefix.Addr().Is4())
			if space == nil {
				continue
			}
			left := []netip.Prefix{b.Prefix}
			for _, h := range space.Overlapping(b.Prefix) {
				if h.Holder != agentHolds(id) {
					continue
				}
				var rest []netip.Prefix
				for _, p := range left {
					rest = append(rest, prefixspace.CutOut(p, h.Prefix)...)
				}
				left = rest
			}
			if len(left) > 0 {
				var held []string
				for _, h := range space.Overlapping(b.Prefix) {
					held = append(held, fmt.Sprintf("%s by %s (quarantined %v)", h.Prefix, h.Holder.id, h.Holder.quarantined))
				}
				return fmt.Errorf("the restore took %v of %s's block %+v (leased to it before) from it; held now: %v", left, id, b, held)
			}
		}
	}
	return nil
}

// grantedIn reports whether p is a grant id received without reporting.
func (m *growthModel) grantedIn(id string, p netip.Prefix) bool {
	for _, g := range m.unreported {
		if g.recipient == id && g.prefix.Overlaps(p) {
			return true
		}
	}
	return false
}

// grantedFrom reports whether id granted part of p without reporting it.
func (m *growthModel) grantedFrom(id string, p netip.Prefix) bool {
	for _, g := range m.unreported {
		if g.donor == id && g.prefix.Overlaps(p) {
			return true
		}
	}
	return false
}

func heldSnapshot(tb *LeaseTable) map[ownedPrefix]bool {
	out := map[ownedPrefix]bool{}
	for _, sp := range tb.spaces {
		for _, s := range []*blockSpace{sp.v4, sp.v6} {
			if s == nil {
				continue
			}
			for _, h := range s.Blocks() {
				out[ownedPrefix{h.Prefix, h.Holder.id, h.Holder.quarantined}] = true
			}
		}
	}
	return out
}

// checkDeleteFreedExactly checks that deleting id freed (or quarantined)
// exactly its blocks and changed nothing of anyone else's.
func checkDeleteFreedExactly(before, after map[ownedPrefix]bool, id string, leases map[string]overlayLease) error {
	mine := map[netip.Prefix]bool{}
	for _, l := range leases {
		for _, b := range l.Blocks {
			mine[b.Prefix] = true
		}
	}
	for o := range before {
		if o.holder == id && !o.quarantined && !mine[o.p] {
			return fmt.Errorf("the allocator held %s for %s, which its record lacks", o.p, id)
		}
		if !(o.holder == id && !o.quarantined) && !after[o] {
			return fmt.Errorf("deleting %s freed %s of %s (quarantined %v)", id, o.p, o.holder, o.quarantined)
		}
	}
	for o := range after {
		if before[o] {
			continue
		}
		if !o.quarantined || o.holder != id || !mine[o.p] {
			return fmt.Errorf("deleting %s added %s held by %s (quarantined %v)", id, o.p, o.holder, o.quarantined)
		}
	}
	for p := range mine {
		if after[ownedPrefix{p, id, false}] {
			return fmt.Errorf("deleting %s left its block %s held", id, p)
		}
	}
	return nil
}

func joinLines(xs []string) string {
	var b bytes.Buffer
	for _, x := range xs[max(0, len(xs)-400):] {
		b.WriteString("  " + x + "\n")
	}
	return b.String()
}
