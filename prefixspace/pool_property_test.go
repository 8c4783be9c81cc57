package prefixspace_test

import (
	"math/big"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/prefixspace"
)

// poolModel is a Pool as the model sees it.
type poolModel struct {
	base   netip.Prefix
	first  *big.Int // the base's first address
	shift  int      // address bits inside one slice
	lo, hi uint64
	used   map[uint64]string
}

func (m *poolModel) addrAt(n uint64) netip.Addr {
	off := new(big.Int).Lsh(new(big.Int).SetUint64(n), uint(m.shift))
	return addrOf(off.Add(off, m.first), m.base.Addr().Is4())
}

// number is the slice of a: its offset from the base, shifted down.
func (m *poolModel) number(a netip.Addr) (uint64, bool) {
	if a.Is4() != m.base.Addr().Is4() || !ivOf(netip.PrefixFrom(a, a.BitLen())).inside(ivOf(m.base)) {
		return 0, false
	}
	n := new(big.Int).Rsh(new(big.Int).Sub(bigAddr(a), m.first), uint(m.shift))
	if !n.IsUint64() || n.Uint64() < m.lo || n.Uint64() > m.hi {
		return 0, false
	}
	return n.Uint64(), true
}

func (m *poolModel) allocate(owner string) (uint64, bool) {
	for n := m.lo; n <= m.hi; n++ {
		if _, taken := m.used[n]; !taken {
			m.used[n] = owner
			return n, true
		}
	}
	return 0, false
}

// randSlice is a slice number in [lo, hi], at an edge half the time.
func randSlice(rng *rand.Rand, lo, hi uint64) uint64 {
	switch rng.IntN(4) {
	case 0:
		return lo
	case 1:
		return hi
	}
	return lo + rng.Uint64N(hi-lo+1)
}

// randPoolAddr is an address to number: mostly inside the base, near its
// slices' edges or anywhere in it; sometimes anywhere at all.
func randPoolAddr(rng *rand.Rand, m *poolModel) netip.Addr {
	is4 := m.base.Addr().Is4()
	switch rng.IntN(6) {
	case 0:
		return randAddr(rng, is4)
	case 1:
		_, is4b := randWidth(rng)
		return randAddr(rng, is4b)
	case 2:
		return m.addrAt(randSlice(rng, m.lo, m.hi))
	}
	return randInside(rng, m.base, m.base.Addr().BitLen()).Addr()
}

// TestPoolAgainstBig checks slice pools and host pools of every base and
// slice length against the model: the address and prefix of a slice, the
// number of an address, and first-fit allocation through random
// allocations, takes and releases.
func TestPoolAgainstBig(t *testing.T) {
	owners := []string{"a", "b", "c"}
	forSeeds(t, func(t *testing.T, rng *rand.Rand) {
		for range 400 {
			width, is4 := randWidth(rng)
			var p *prefixspace.Pool
			var m *poolModel
			if rng.IntN(2) == 0 {
				bits := randBits(rng, 0, width)
				base := randPrefix(rng, is4, bits)
				slice := randBits(rng, bits, width)
				exp := min(slice-bits, 62)
				p = prefixspace.NewPool(base, slice)
				m = &poolModel{base: base, first: ivOf(base).first, shift: width - slice, lo: 0, hi: 1<<exp - 1}
			} else { // hosts: at most a /30 or /126
				bits := randBits(rng, 0, width-2)
				base := randPrefix(rng, is4, bits)
				exp := min(width-bits, 62)
				p = prefixspace.NewHostPool(base)
				m = &poolModel{base: base, first: ivOf(base).first, shift: 0, lo: 1, hi: 1<<exp - 2}
			}
			m.used = map[uint64]string{}
			for range 30 {
				n := randSlice(rng, m.lo, m.hi)
				if got, want := p.AddrAt(n), m.addrAt(n); got != want {
					t.Fatalf("pool %s (shift %d): AddrAt(%d) = %s, want %s", m.base, m.shift, n, got, want)
				}
				if got, want := p.PrefixAt(n), netip.PrefixFrom(m.addrAt(n), width-m.shift); got != want {
					t.Fatalf("pool %s (shift %d): PrefixAt(%d) = %s, want %s", m.base, m.shift, n, got, want)
				}
				a := randPoolAddr(rng, m)
				got, ok := p.Number(a)
				want, wok := m.number(a)
				if got != want || ok != wok {
					t.Fatalf("pool %s (shift %d, slices %d-%d): Number(%s) = %d %v, want %d %v", m.base, m.shift, m.lo, m.hi, a, got, ok, want, wok)
				}
				switch op := rng.IntN(6); {
				case op < 3:
					o := owners[rng.IntN(len(owners))]
					got, ok := p.Allocate(o)
					want, wok := m.allocate(o)
					if got != want || ok != wok {
						t.Fatalf("pool %s: Allocate = %d %v, want %d %v (used %v)", m.base, got, ok, want, wok, m.used)
					}
				case op < 5:
					n := randSlice(rng, m.lo, m.hi)
					for k := range m.used { // mostly a used one
						if rng.IntN(2) == 0 {
							n = k
						}
						break
					}
					p.Release(n)
					delete(m.used, n)
				default:
					n, o := randSlice(rng, m.lo, m.hi), owners[rng.IntN(len(owners))]
					p.Take(n, o)
					m.used[n] = o
				}
				for n, o := range m.used {
					if got := p.Owner(n); got != o {
						t.Fatalf("pool %s: Owner(%d) = %q, want %q", m.base, n, got, o)
					}
				}
			}
		}
	})
}
