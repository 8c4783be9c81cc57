package prefixspace_test

import (
	"fmt"
	"math/big"
	mrand "math/rand"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/carve-net/carve/ring"
)

// The model: every address, offset and prefix as math/big integers,
// computed without ring.Uint128 or anything of the package under test, so
// the property tests compare two independent computations.

// bigAddr is a as an integer.
func bigAddr(a netip.Addr) *big.Int { return new(big.Int).SetBytes(a.AsSlice()) }

// addrOf is the address of integer v (0 <= v < 2^width) in a family.
func addrOf(v *big.Int, is4 bool) netip.Addr {
	b := make([]byte, 16)
	if is4 {
		b = b[:4]
	}
	v.FillBytes(b)
	a, _ := netip.AddrFromSlice(b)
	return a
}

// pow2 is 2^n.
func pow2(n int) *big.Int { return new(big.Int).Lsh(big.NewInt(1), uint(n)) }

// bigU is a 128-bit number as an integer.
func bigU(u ring.Uint128) *big.Int {
	v := new(big.Int).SetUint64(u.Hi)
	return v.Lsh(v, 64).Or(v, new(big.Int).SetUint64(u.Lo))
}

// uOf is integer v (0 <= v < 2^128) as a 128-bit number.
func uOf(v *big.Int) ring.Uint128 {
	lo := new(big.Int).And(v, new(big.Int).SetUint64(^uint64(0)))
	return ring.Uint128{Hi: new(big.Int).Rsh(v, 64).Uint64(), Lo: lo.Uint64()}
}

// interval is an inclusive range of integers.
type interval struct{ first, last *big.Int }

func (i interval) String() string { return fmt.Sprintf("[%s, %s]", i.first, i.last) }

// ivOf is the addresses of p as integers (host bits ignored).
func ivOf(p netip.Prefix) interval {
	size := pow2(p.Addr().BitLen() - p.Bits())
	first := new(big.Int).Sub(bigAddr(p.Addr()), new(big.Int).Mod(bigAddr(p.Addr()), size))
	return interval{first, new(big.Int).Sub(new(big.Int).Add(first, size), big.NewInt(1))}
}

func (i interval) size() *big.Int {
	return new(big.Int).Add(new(big.Int).Sub(i.last, i.first), big.NewInt(1))
}

func (i interval) overlaps(o interval) bool {
	return i.first.Cmp(o.last) <= 0 && o.first.Cmp(i.last) <= 0
}

func (i interval) inside(o interval) bool {
	return o.first.Cmp(i.first) <= 0 && i.last.Cmp(o.last) <= 0
}

// minus is i shifted down by base (offsets from base).
func (i interval) minus(base *big.Int) interval {
	return interval{new(big.Int).Sub(i.first, base), new(big.Int).Sub(i.last, base)}
}

// isMasked reports whether p has no host bits set, with the model.
func isMasked(p netip.Prefix) bool { return bigAddr(p.Addr()).Cmp(ivOf(p).first) == 0 }

// The random inputs. Prefix lengths lean to the edges (/0, /1, the host
// prefix and the one above it, the bounds given) where the arithmetic has
// its special cases.

// seeds returns the fixed seeds and one fresh one, or only the seed
// CARVE_PREFIXSPACE_SEED names.
func seeds(t *testing.T) []uint64 {
	t.Helper()
	if s := os.Getenv("CARVE_PREFIXSPACE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CARVE_PREFIXSPACE_SEED=%q: want a number", s)
		}
		return []uint64{v}
	}
	return []uint64{1, 2, 3, uint64(time.Now().UnixNano())}
}

// forSeeds runs f once per seed in a subtest that prints its seed.
func forSeeds(t *testing.T, f func(t *testing.T, rng *rand.Rand)) {
	t.Helper()
	for _, seed := range seeds(t) {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			t.Logf("seed %d (replay with CARVE_PREFIXSPACE_SEED=%d)", seed, seed)
			f(t, rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)))
		})
	}
}

// randBits is a prefix length in [lo, hi], at an edge half the time.
func randBits(rng *rand.Rand, lo, hi int) int {
	if rng.IntN(2) == 0 {
		edges := []int{lo, hi, min(lo+1, hi), max(hi-1, lo), 0, 1, 32, 31, 64, 127, 128}
		if e := edges[rng.IntN(len(edges))]; e >= lo && e <= hi {
			return e
		}
	}
	return lo + rng.IntN(hi-lo+1)
}

// randWidth picks a family: IPv4 (32 bits) or IPv6 (128).
func randWidth(rng *rand.Rand) (int, bool) {
	if rng.IntN(2) == 0 {
		return 32, true
	}
	return 128, false
}

// randAddr is an address of a family: random bits, or all zeros or ones.
func randAddr(rng *rand.Rand, is4 bool) netip.Addr {
	b := make([]byte, 16)
	if is4 {
		b = b[:4]
	}
	switch rng.IntN(8) {
	case 0: // all zeros
	case 1:
		for i := range b {
			b[i] = 0xff
		}
	default:
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// randPrefix is a masked prefix of a family, of length bits.
func randPrefix(rng *rand.Rand, is4 bool, bits int) netip.Prefix {
	return netip.PrefixFrom(randAddr(rng, is4), bits).Masked()
}

// randInside is a masked prefix of length bits (>= outer's) inside outer.
func randInside(rng *rand.Rand, outer netip.Prefix, bits int) netip.Prefix {
	width := outer.Addr().BitLen()
	n := randBelow(rng, pow2(bits-outer.Bits()))
	a := new(big.Int).Add(ivOf(outer).first, n.Lsh(n, uint(width-bits)))
	return netip.PrefixFrom(addrOf(a, outer.Addr().Is4()), bits)
}

// randBelow is a uniform integer in [0, n).
func randBelow(rng *rand.Rand, n *big.Int) *big.Int {
	return new(big.Int).Rand(mrand.New(rngSource{rng}), n)
}

// rngSource lets big.Int.Rand draw from the seeded math/rand/v2 generator.
type rngSource struct{ rng *rand.Rand }

func (s rngSource) Int63() int64   { return s.rng.Int64() }
func (s rngSource) Uint64() uint64 { return s.rng.Uint64() }
func (s rngSource) Seed(int64)     {}

// checkSubtract checks Subtract(outer, inner) against the model: outer
// alone when inner is not inside it; else disjoint, masked pieces in
// address order, one per level, inside outer and apart from inner, whose
// sizes with inner's add up to outer's (so they cover exactly the rest).
func checkSubtract(outer, inner netip.Prefix, got []netip.Prefix) error {
	inside := outer.Addr().Is4() == inner.Addr().Is4() && ivOf(inner).inside(ivOf(outer))
	if !inside {
		if len(got) != 1 || got[0] != outer {
			return fmt.Errorf("%s - %s (not inside) = %v, want outer alone", outer, inner, got)
		}
		return nil
	}
	if len(got) != inner.Bits()-outer.Bits() {
		return fmt.Errorf("%s - %s = %d pieces %v, want %d (one per level)", outer, inner, len(got), got, inner.Bits()-outer.Bits())
	}
	sum := ivOf(inner).size()
	for i, p := range got {
		iv := ivOf(p)
		switch {
		case p.Addr().Is4() != outer.Addr().Is4():
			return fmt.Errorf("%s - %s: piece %s of another family", outer, inner, p)
		case !isMasked(p):
			return fmt.Errorf("%s - %s: piece %s is not aligned", outer, inner, p)
		case !iv.inside(ivOf(outer)):
			return fmt.Errorf("%s - %s: piece %s is outside outer", outer, inner, p)
		case iv.overlaps(ivOf(inner)):
			return fmt.Errorf("%s - %s: piece %s overlaps inner", outer, inner, p)
		case i > 0 && ivOf(got[i-1]).last.Cmp(iv.first) >= 0:
			return fmt.Errorf("%s - %s: pieces %s and %s overlap or are out of order", outer, inner, got[i-1], p)
		}
		sum.Add(sum, iv.size())
	}
	if sum.Cmp(ivOf(outer).size()) != 0 {
		return fmt.Errorf("%s - %s: pieces and inner hold %s addresses, outer %s", outer, inner, sum, ivOf(outer).size())
	}
	return nil
}

// checkCutOut checks CutOut(b, p) against the model.
func checkCutOut(b, p netip.Prefix, got []netip.Prefix) error {
	bi, pi := ivOf(b), ivOf(p)
	switch {
	case b.Addr().Is4() != p.Addr().Is4() || !bi.overlaps(pi):
		if len(got) != 1 || got[0] != b {
			return fmt.Errorf("CutOut(%s, %s), apart, = %v, want %s", b, p, got, b)
		}
		return nil
	case bi.inside(pi):
		if len(got) != 0 {
			return fmt.Errorf("CutOut(%s, %s), inside, = %v, want nothing", b, p, got)
		}
		return nil
	}
	return checkSubtract(b, p, got)
}
