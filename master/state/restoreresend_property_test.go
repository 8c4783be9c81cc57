package state

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/prefixspace"
	"github.com/carve-net/carve/ring"
)

// TestReportResendProperty runs random histories of registrations, grows,
// ring grants reported (with their donor's statement, or by the donor
// without one), returns, deletes, quarantine releases, snapshots saved,
// restores to any of them (in the running cluster, now and then a
// whole-cluster restore into a new log), followers caught up by Raft
// snapshot, and reports sent again with their request id at any point. It
// checks after every step that both replicas hold the table's invariants
// and the same state, and for every report: a known request id is answered
// with its outcome and changes nothing; a refused report changes nothing;
// an applied one moves space only between its own parties (a grant's donor
// and recipient, a returner and the donors of what it gives back, a
// grower); and a statement moves space once in a log. Seeds are printed;
// CARVE_RESEND_SEED replays one.
func TestReportResendProperty(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if testing.Short() {
		seeds = seeds[:4]
	}
	if s := os.Getenv("CARVE_RESEND_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CARVE_RESEND_SEED=%q: %v", s, err)
		}
		seeds = []uint64{v}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) {
			t.Logf("seed %d (replay with CARVE_RESEND_SEED=%d)", seed, seed)
			if err := runResendHistory(t, seed, 300); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		})
	}
}

// resendHistory is what a random history remembers: the reports sent (to
// send them again), the answers to their request ids, the snapshots saved,
// and how often each statement moved space in this log.
type resendHistory struct {
	l       *resendLog
	rng     *rand.Rand
	sent    []command
	answers map[string]Result
	snaps   [][]byte
	moved   map[string]int
	nextID  int
	lines   []string
	// seen counts what the sends met, by kind: the log says what a
	// seed exercised.
	seen map[string]int
}

func runResendHistory(t *testing.T, seed uint64, steps int) error {
	h := &resendHistory{l: newResendLog(t), rng: rand.New(rand.NewPCG(seed, 0x5eed)), answers: map[string]Result{}, moved: map[string]int{}, seen: map[string]int{}}
	ids := []string{"a", "b", "c", "d", "e"}
	for step := 0; step < steps; step++ {
		agents := slices.Sorted(maps.Keys(h.l.tables[0].agents))
		op := h.rng.IntN(14)
		var err error
		switch {
		case op == 0 || len(agents) < 2:
			id := ids[h.rng.IntN(len(ids))]
			h.l.register(id)
			h.note("register %s", id)
		case op <= 2:
			err = h.send(growRequest(h.newID(), agents[h.rng.IntN(len(agents))]))
		case op <= 4:
			if c, ok := h.honestGrant(agents); ok {
				err = h.send(c)
			}
		case op == 5:
			if c, ok := h.someReturn(agents); ok {
				err = h.send(c)
			}
		case op == 6:
			id := agents[h.rng.IntN(len(agents))]
			h.l.mustApply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{id}}})
			h.note("delete %s", id)
			if h.rng.IntN(2) == 0 {
				res := h.l.mustApply(command{Op: opRelease, Release: &releaseCmd{Acks: h.l.acks()}})
				h.note("release: %d", res.Released)
			}
		case op == 7:
			h.snaps = append(h.snaps, h.l.save())
			h.note("save snapshot %d", len(h.snaps)-1)
		case op == 8 && len(h.snaps) > 0:
			i := h.rng.IntN(len(h.snaps))
			if h.rng.IntN(8) == 0 {
				h.l.restoreWholeCluster(h.snaps[i])
				// A new log knows the statements of its snapshot only.
				h.moved = map[string]int{}
				for s := range h.l.tables[0].usedStatements {
					h.moved[s] = 1
				}
				h.note("whole-cluster restore of snapshot %d", i)
			} else {
				h.l.restore(h.snaps[i])
				h.note("restore snapshot %d", i)
			}
		case op == 9:
			h.l.catchUp()
			h.note("catch up")
		case len(h.sent) > 0: // a report sent again
			err = h.send(h.sent[h.rng.IntN(len(h.sent))])
		}
		if err != nil {
			return fmt.Errorf("step %d: %v\nhistory:\n%s", step, err, joinLines(h.lines))
		}
	}
	t.Logf("seed %d: %v", seed, h.seen)
	return nil
}

func (h *resendHistory) newID() string {
	h.nextID++
	return fmt.Sprintf("r%d", h.nextID)
}

func (h *resendHistory) note(format string, args ...any) {
	h.lines = append(h.lines, fmt.Sprintf(format, args...))
}

// honestGrant is a ring grant a donor could make of space the masters
// give it: a part of one of its blocks, to another live agent, reported by
// the recipient with a fresh statement or by the donor without one.
func (h *resendHistory) honestGrant(agents []string) (command, bool) {
	donor, recip := agents[h.rng.IntN(len(agents))], agents[h.rng.IntN(len(agents))]
	var blocks []netip.Prefix
	for _, b := range h.l.tables[0].agents[donor].Leases["g"].Blocks {
		if b.Prefix.Addr().Is4() && b.Prefix.Bits() < 30 {
			blocks = append(blocks, b.Prefix)
		}
	}
	if donor == recip || len(blocks) == 0 {
		return command{}, false
	}
	p := blocks[h.rng.IntN(len(blocks))]
	bits := min(p.Bits()+h.rng.IntN(4), 30)
	off := ring.U128(h.rng.Uint64N(1 << uint(bits-p.Bits()))).Lsh(uint(32 - bits))
	g := netip.PrefixFrom(prefixspace.AddrPlus(p.Addr(), off), bits)
	sig := ""
	if h.rng.IntN(3) > 0 {
		sig = "sig-" + h.newID()
	}
	return grantReport(h.newID(), donor, recip, g.String(), sig), true
}

// someReturn is a return of one of an agent's grown or granted blocks.
func (h *resendHistory) someReturn(agents []string) (command, bool) {
	id := agents[h.rng.IntN(len(agents))]
	var blocks []netip.Prefix
	for _, b := range h.l.tables[0].agents[id].Leases["g"].Blocks {
		if b.Origin != api.BlockLeased {
			blocks = append(blocks, b.Prefix)
		}
	}
	if len(blocks) == 0 {
		return command{}, false
	}
	return returnReport(h.newID(), id, blocks[h.rng.IntN(len(blocks))].String()), true
}

// send applies a report (new, or sent again) and checks what it did.
func (h *resendHistory) send(c command) error {
	tb := h.l.tables[0]
	known := tb.requests.known(c.RequestID)
	_, before := tb.StateDigest()
	held := heldSnapshot(tb)
	parties := h.parties(c)
	resent := slices.ContainsFunc(h.sent, func(s command) bool { return s.RequestID == c.RequestID })
	res := h.l.apply(c)
	h.note("%s %s %s: resent %v, known %v, %v", c.Op, c.RequestID, describe(c), resent, known, res.Err)
	if !resent {
		h.sent = append(h.sent, c)
	}
	kind := fmt.Sprintf("%s resent=%v known=%v", c.Op, resent, known)
	switch {
	case known:
	case res.Err != nil:
		kind += " refused:" + errors.Unwrap(res.Err).Error()
	default:
		kind += " applied"
	}
	h.seen[kind]++
	tb = h.l.tables[0]
	_, after := tb.StateDigest()
	switch {
	case known:
		if res.Err != nil || !jsonEqual(res.Agent, h.answers[c.RequestID].Agent) || after != before {
			return fmt.Errorf("the retry of a known request %s: %+v %v, state changed %v; want its first answer %+v",
				c.RequestID, res.Agent, res.Err, after != before, h.answers[c.RequestID].Agent)
		}
		return nil
	case res.Err != nil:
		if !errors.Is(res.Err, ErrStatementUsed) && !errors.Is(res.Err, ErrBlockConflict) && !errors.Is(res.Err, ErrInvalidBlock) &&
			!errors.Is(res.Err, ErrUnknownAgent) && !errors.Is(res.Err, ErrOverlayExhausted) && !errors.Is(res.Err, ErrQuota) {
			return fmt.Errorf("%s %s refused with an unnamed error: %v", c.Op, c.RequestID, res.Err)
		}
		if after != before {
			return fmt.Errorf("the refused %s %s (%v) changed the state", c.Op, c.RequestID, res.Err)
		}
		return nil
	}
	h.answers[c.RequestID] = res
	for o := range symmetricDifference(held, heldSnapshot(tb)) {
		if !parties[o.holder] {
			return fmt.Errorf("%s %s (%s) changed %s of %s (quarantined %v), not one of its parties %v",
				c.Op, c.RequestID, describe(c), o.p, o.holder, o.quarantined, slices.Sorted(maps.Keys(parties)))
		}
	}
	if c.Op == opGrant && c.Grant.Statement != "" && !held[ownedPrefix{c.Grant.Prefix, c.Grant.Recipient, false}] &&
		heldSnapshot(tb)[ownedPrefix{c.Grant.Prefix, c.Grant.Recipient, false}] {
		if h.moved[c.Grant.Statement]++; h.moved[c.Grant.Statement] > 1 {
			return fmt.Errorf("statement of %s moved %s a second time in this log", c.RequestID, c.Grant.Prefix)
		}
	}
	return nil
}

// parties are the holders a report may change: a grant's donor and
// recipient, a returner and the donors of the blocks it holds, a grower.
func (h *resendHistory) parties(c command) map[string]bool {
	out := map[string]bool{}
	switch c.Op {
	case opGrant:
		out[c.Grant.Donor], out[c.Grant.Recipient] = true, true
	case opReturn:
		out[c.Return.AgentID] = true
		if rec := h.l.tables[0].agents[c.Return.AgentID]; rec != nil {
			for _, b := range rec.Leases["g"].Blocks {
				if b.Donor != "" && b.Prefix.Overlaps(c.Return.Prefix) {
					out[b.Donor] = true
				}
			}
		}
	case opGrow:
		out[c.Grow.AgentID] = true
	}
	return out
}

func describe(c command) string {
	switch c.Op {
	case opGrant:
		return fmt.Sprintf("%s %s -> %s statement %.8s", c.Grant.Prefix, c.Grant.Donor, c.Grant.Recipient, c.Grant.Statement)
	case opReturn:
		return fmt.Sprintf("%s by %s", c.Return.Prefix, c.Return.AgentID)
	case opGrow:
		return "by " + c.Grow.AgentID
	}
	return ""
}

// symmetricDifference is what one of two holdings has and the other not.
func symmetricDifference(a, b map[ownedPrefix]bool) map[ownedPrefix]bool {
	out := map[ownedPrefix]bool{}
	for o := range a {
		if !b[o] {
			out[o] = true
		}
	}
	for o := range b {
		if !a[o] {
			out[o] = true
		}
	}
	return out
}
