package prefixspace_test

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/carve-net/carve/prefixspace"
)

// Every property test below draws prefixes of both families and every
// length (the edges /0, /32, /128 and their neighbours half the time) and
// compares the package's answer with the model's (model_test.go), which
// computes it on math/big integers. Seeds are printed; replay one with
// CARVE_PREFIXSPACE_SEED=<seed>.

// TestSubtractAgainstBig: Subtract and CutOut against the model.
func TestSubtractAgainstBig(t *testing.T) {
	forSeeds(t, func(t *testing.T, rng *rand.Rand) {
		for range 1000 { // up to 128 pieces each: FuzzSubtract goes further
			width, is4 := randWidth(rng)
			outer := randPrefix(rng, is4, randBits(rng, 0, width))
			var inner netip.Prefix
			switch rng.IntN(5) {
			case 0: // anywhere, maybe larger, maybe the other family
				w2, is4b := randWidth(rng)
				inner = randPrefix(rng, is4b, randBits(rng, 0, w2))
			default:
				inner = randInside(rng, outer, randBits(rng, outer.Bits(), width))
			}
			if err := checkSubtract(outer, inner, prefixspace.Subtract(outer, inner)); err != nil {
				t.Fatal(err)
			}
			if err := checkCutOut(outer, inner, prefixspace.CutOut(outer, inner)); err != nil {
				t.Fatal(err)
			}
			if err := checkCutOut(inner, outer, prefixspace.CutOut(inner, outer)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestPrefixArithmeticAgainstBig: Contains, Sibling, Parent, Halves and
// AddrPlus against the model.
func TestPrefixArithmeticAgainstBig(t *testing.T) {
	forSeeds(t, func(t *testing.T, rng *rand.Rand) {
		for range 3000 {
			width, is4 := randWidth(rng)
			bits := randBits(rng, 0, width)
			p := randPrefix(rng, is4, bits)
			iv, size := ivOf(p), pow2(width-bits)

			var q netip.Prefix
			if rng.IntN(3) == 0 {
				w2, is4b := randWidth(rng)
				q = randPrefix(rng, is4b, randBits(rng, 0, w2))
			} else {
				q = randInside(rng, p, randBits(rng, bits, width))
			}
			want := q.Addr().Is4() == is4 && ivOf(q).inside(iv)
			if got := prefixspace.Contains(p, q); got != want {
				t.Fatalf("Contains(%s, %s) = %v, want %v", p, q, got, want)
			}

			if bits > 0 {
				sib := new(big.Int).Xor(iv.first, size)
				if got := prefixspace.Sibling(p); got.Bits() != bits || !isMasked(got) || bigAddr(got.Addr()).Cmp(sib) != 0 {
					t.Fatalf("Sibling(%s) = %s, want the /%d at %s", p, got, bits, addrOf(sib, is4))
				}
				up := pow2(width - bits + 1)
				par := new(big.Int).Sub(iv.first, new(big.Int).Mod(iv.first, up))
				if got := prefixspace.Parent(p); got.Bits() != bits-1 || bigAddr(got.Addr()).Cmp(par) != 0 {
					t.Fatalf("Parent(%s) = %s, want the /%d at %s", p, got, bits-1, addrOf(par, is4))
				}
			} else if got := prefixspace.Sibling(p); got != p {
				t.Fatalf("Sibling(%s) = %s, want itself", p, got)
			}
			if bits < width {
				half := new(big.Int).Rsh(size, 1)
				lo, hi := prefixspace.Halves(p)
				if lo.Bits() != bits+1 || hi.Bits() != bits+1 || bigAddr(lo.Addr()).Cmp(iv.first) != 0 ||
					bigAddr(hi.Addr()).Cmp(new(big.Int).Add(iv.first, half)) != 0 {
					t.Fatalf("Halves(%s) = %s %s", p, lo, hi)
				}
			}

			a := randAddr(rng, is4)
			off := randBelow(rng, pow2(128))
			if rng.IntN(2) == 0 { // mostly no wrap: an offset inside the family
				off = randBelow(rng, pow2(width))
			}
			sum := new(big.Int).Mod(new(big.Int).Add(bigAddr(a), off), pow2(width))
			if got := prefixspace.AddrPlus(a, uOf(off)); got != addrOf(sum, is4) {
				t.Fatalf("AddrPlus(%s, %s) = %s, want %s", a, off, got, addrOf(sum, is4))
			}
		}
	})
}

// spaceModel is a Space as the model sees it: the held prefixes, unsorted,
// with their offsets from the universe's first address.
type spaceModel struct {
	u     netip.Prefix
	base  *big.Int
	ulast *big.Int // the universe's last offset
	held  []modelBlock
}

type modelBlock struct {
	p      netip.Prefix
	holder string
	off    interval
}

func newSpaceModel(u netip.Prefix) *spaceModel {
	iv := ivOf(u)
	return &spaceModel{u: u, base: iv.first, ulast: iv.minus(iv.first).last}
}

// span is p's offsets, and whether p is a prefix inside the universe.
func (m *spaceModel) span(p netip.Prefix) (interval, bool) {
	if !p.IsValid() || p.Addr().Is4() != m.u.Addr().Is4() || !ivOf(p).inside(ivOf(m.u)) {
		return interval{}, false
	}
	return ivOf(p).minus(m.base), true
}

func (m *spaceModel) add(p netip.Prefix, holder string) bool {
	off, ok := m.span(p)
	if !ok {
		return false
	}
	for _, h := range m.held {
		if h.off.overlaps(off) {
			return false
		}
	}
	m.held = append(m.held, modelBlock{p, holder, off})
	return true
}

func (m *spaceModel) remove(p netip.Prefix, holder string, anyHolder bool) bool {
	for i, h := range m.held {
		if h.p == p && (anyHolder || h.holder == holder) {
			m.held = slices.Delete(m.held, i, i+1)
			return true
		}
	}
	return false
}

// sorted is the held blocks in address order.
func (m *spaceModel) sorted() []modelBlock {
	out := slices.Clone(m.held)
	slices.SortFunc(out, func(a, b modelBlock) int { return a.off.first.Cmp(b.off.first) })
	return out
}

func (m *spaceModel) overlapping(p netip.Prefix) []modelBlock {
	off, ok := m.span(p)
	if !ok {
		return nil
	}
	var out []modelBlock
	for _, h := range m.sorted() {
		if h.off.overlaps(off) {
			out = append(out, h)
		}
	}
	return out
}

func (m *spaceModel) covers(p netip.Prefix) bool {
	off, ok := m.span(p)
	if !ok {
		return false
	}
	next := off.first
	for _, h := range m.overlapping(p) {
		if h.off.first.Cmp(next) > 0 {
			return false
		}
		next = new(big.Int).Add(h.off.last, big.NewInt(1))
		if next.Cmp(off.last) > 0 {
			return true
		}
	}
	return false
}

// firstFree: the lowest free aligned block starts at 0 or right above a
// held block, rounded up to the block size (the block below it is not free,
// so a held block ends inside that block).
func (m *spaceModel) firstFree(bits int) (netip.Prefix, bool) {
	width := m.u.Addr().BitLen()
	if bits < m.u.Bits() || bits > width {
		return netip.Prefix{}, false
	}
	size := pow2(width - bits)
	cands := []*big.Int{big.NewInt(0)}
	for _, h := range m.held {
		next := new(big.Int).Add(h.off.last, big.NewInt(1))
		up := new(big.Int).Add(next, new(big.Int).Sub(size, big.NewInt(1)))
		cands = append(cands, up.Sub(up, new(big.Int).Mod(up, size)))
	}
	var best *big.Int
	for _, c := range cands {
		blk := interval{c, new(big.Int).Sub(new(big.Int).Add(c, size), big.NewInt(1))}
		if blk.last.Cmp(m.ulast) > 0 || (best != nil && c.Cmp(best) >= 0) {
			continue
		}
		free := true
		for _, h := range m.held {
			free = free && !h.off.overlaps(blk)
		}
		if free {
			best = c
		}
	}
	if best == nil {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(addrOf(new(big.Int).Add(m.base, best), m.u.Addr().Is4()), bits), true
}

func (m *spaceModel) freeSpans() []interval {
	var out []interval
	next := big.NewInt(0)
	for _, h := range m.sorted() {
		if h.off.first.Cmp(next) > 0 {
			out = append(out, interval{next, new(big.Int).Sub(h.off.first, big.NewInt(1))})
		}
		next = new(big.Int).Add(h.off.last, big.NewInt(1))
	}
	if next.Cmp(m.ulast) <= 0 {
		out = append(out, interval{next, m.ulast})
	}
	return out
}

// heldEqual compares the space's blocks (with their spans) to the model's.
func heldEqual(got []prefixspace.Held[string], want []modelBlock) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d blocks held, the model %d", len(got), len(want))
	}
	for i, g := range got {
		w := want[i]
		if g.Prefix != w.p || g.Holder != w.holder || bigU(g.Span.First).Cmp(w.off.first) != 0 || bigU(g.Span.Last).Cmp(w.off.last) != 0 {
			return fmt.Errorf("block %d: %s of %s at [%s, %s], the model %s of %s at %v", i, g.Prefix, g.Holder, g.Span.First, g.Span.Last, w.p, w.holder, w.off)
		}
	}
	return nil
}

// randQuery is a prefix to ask a space about: mostly inside its universe,
// sometimes anywhere in its family or in the other one.
func randQuery(rng *rand.Rand, u netip.Prefix) netip.Prefix {
	width := u.Addr().BitLen()
	switch rng.IntN(8) {
	case 0:
		return randPrefix(rng, u.Addr().Is4(), randBits(rng, 0, width))
	case 1:
		w2, is4 := randWidth(rng)
		return randPrefix(rng, is4, randBits(rng, 0, w2))
	default:
		// Small universes fill up: lean to blocks a few bits below it.
		lo := u.Bits()
		if rng.IntN(2) == 0 {
			lo = min(u.Bits()+rng.IntN(9), width)
		}
		return randInside(rng, u, randBits(rng, lo, width))
	}
}

// TestSpaceAgainstBig runs random adds, removes and first-fit allocations
// on spaces of every universe length and checks every answer, the held
// blocks, their spans and the free spans against the model after each (a
// failure prints the last operations).
func TestSpaceAgainstBig(t *testing.T) {
	holders := []string{"a", "b", "c"}
	forSeeds(t, func(t *testing.T, rng *rand.Rand) {
		for range 150 {
			width, is4 := randWidth(rng)
			u := randPrefix(rng, is4, randBits(rng, 0, width))
			s, m := prefixspace.NewSpace[string](u), newSpaceModel(u)
			var history []string
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("universe %s after %v: %s", u, history[max(len(history)-12, 0):], fmt.Sprintf(format, args...))
			}
			for range 40 {
				switch op := rng.IntN(10); {
				case op < 4: // add a prefix
					p, h := randQuery(rng, u), holders[rng.IntN(len(holders))]
					err := s.Add(p, h)
					history = append(history, fmt.Sprintf("add %s %s: %v", p, h, err))
					if ok := m.add(p, h); ok != (err == nil) {
						fail("Add(%s) = %v, the model says ok %v", p, err, ok)
					}
				case op < 7: // first fit, and take what it found
					bits := randBits(rng, max(u.Bits()-1, 0), width+1)
					got, ok := s.FirstFree(bits)
					want, wok := m.firstFree(bits)
					history = append(history, fmt.Sprintf("firstFree /%d: %s %v", bits, got, ok))
					if ok != wok || got != want {
						fail("FirstFree(/%d) = %s %v, the model %s %v", bits, got, ok, want, wok)
					}
					if ok && rng.IntN(3) > 0 {
						h := holders[rng.IntN(len(holders))]
						if err := s.Add(got, h); err != nil || !m.add(got, h) {
							fail("Add(%s) of a free block: %v", got, err)
						}
					}
				case op < 9: // remove a held block or anything
					p := randQuery(rng, u)
					if blocks := m.held; len(blocks) > 0 && rng.IntN(4) > 0 {
						p = blocks[rng.IntN(len(blocks))].p
					}
					if rng.IntN(2) == 0 {
						h := holders[rng.IntN(len(holders))]
						got := s.RemoveHeld(p, h)
						history = append(history, fmt.Sprintf("removeHeld %s %s: %v", p, h, got))
						if want := m.remove(p, h, false); got != want {
							fail("RemoveHeld(%s, %s) = %v, the model %v", p, h, got, want)
						}
					} else {
						got := s.Remove(p)
						history = append(history, fmt.Sprintf("remove %s: %v", p, got))
						if want := m.remove(p, "", true); got != want {
							fail("Remove(%s) = %v, the model %v", p, got, want)
						}
					}
				default: // questions only
				}
				if err := heldEqual(s.Blocks(), m.sorted()); err != nil {
					fail("%v", err)
				}
				if s.Len() != len(m.held) {
					fail("Len() = %d, the model %d", s.Len(), len(m.held))
				}
				free, wfree := s.FreeSpans(), m.freeSpans()
				if len(free) != len(wfree) {
					fail("%d free spans, the model %d (%v)", len(free), len(wfree), wfree)
				}
				for i, f := range free {
					if bigU(f.First).Cmp(wfree[i].first) != 0 || bigU(f.Last).Cmp(wfree[i].last) != 0 {
						fail("free span %d is [%s, %s], the model %v", i, f.First, f.Last, wfree[i])
					}
				}
				q := randQuery(rng, u)
				sp, ok := s.Span(q)
				wsp, wok := m.span(q)
				if ok != wok || ok && (bigU(sp.First).Cmp(wsp.first) != 0 || bigU(sp.Last).Cmp(wsp.last) != 0) {
					fail("Span(%s) = [%s, %s] %v, the model %v %v", q, sp.First, sp.Last, ok, wsp, wok)
				}
				var got []string
				for _, h := range s.Overlapping(q) {
					got = append(got, h.Prefix.String()+" "+h.Holder)
				}
				var want []string
				for _, h := range m.overlapping(q) {
					want = append(want, h.p.String()+" "+h.holder)
				}
				if !slices.Equal(got, want) {
					fail("Overlapping(%s) = %v, the model %v", q, got, want)
				}
				if got, want := s.Covers(q), m.covers(q); got != want {
					fail("Covers(%s) = %v, the model %v", q, got, want)
				}
			}
		}
	})
}
