package ring

import (
	"math"
	"math/big"
	"math/bits"
	"math/rand/v2"
	"net/netip"
)

// Uint128 is an unsigned 128-bit integer. Offsets and counts of addresses in
// an IPv6 universe do not fit in 64 bits (a /64 holds 2^64 addresses), so the
// ring counts everything in this type.
type Uint128 struct {
	Hi, Lo uint64
}

// U128 lifts a 64-bit value.
func U128(v uint64) Uint128 { return Uint128{Lo: v} }

// IsZero reports whether u is 0.
func (u Uint128) IsZero() bool { return u.Hi == 0 && u.Lo == 0 }

// Cmp returns -1, 0 or +1 as u is less than, equal to or greater than v.
func (u Uint128) Cmp(v Uint128) int {
	switch {
	case u.Hi < v.Hi:
		return -1
	case u.Hi > v.Hi:
		return 1
	case u.Lo < v.Lo:
		return -1
	case u.Lo > v.Lo:
		return 1
	}
	return 0
}

// Less reports whether u < v.
func (u Uint128) Less(v Uint128) bool {
	return u.Hi < v.Hi || (u.Hi == v.Hi && u.Lo < v.Lo)
}

// Add returns u+v, wrapping at 2^128.
func (u Uint128) Add(v Uint128) Uint128 {
	lo, c := bits.Add64(u.Lo, v.Lo, 0)
	hi, _ := bits.Add64(u.Hi, v.Hi, c)
	return Uint128{hi, lo}
}

// Sub returns u-v, wrapping below 0.
func (u Uint128) Sub(v Uint128) Uint128 {
	lo, b := bits.Sub64(u.Lo, v.Lo, 0)
	hi, _ := bits.Sub64(u.Hi, v.Hi, b)
	return Uint128{hi, lo}
}

// Uint64 returns u as a uint64 and whether it fits.
func (u Uint128) Uint64() (uint64, bool) { return u.Lo, u.Hi == 0 }

// Float64 approximates u, for display and benchmarks.
func (u Uint128) Float64() float64 {
	return float64(u.Hi)*math.Exp2(64) + float64(u.Lo)
}

// Big returns u as a big.Int.
func (u Uint128) Big() *big.Int {
	b := new(big.Int).SetUint64(u.Hi)
	b.Lsh(b, 64)
	return b.Or(b, new(big.Int).SetUint64(u.Lo))
}

// String renders u in decimal.
func (u Uint128) String() string {
	if u.Hi == 0 {
		return big.NewInt(0).SetUint64(u.Lo).String()
	}
	return u.Big().String()
}

func (u Uint128) inc() Uint128 { return u.Add(Uint128{Lo: 1}) }
func (u Uint128) dec() Uint128 { return u.Sub(Uint128{Lo: 1}) }

func (u Uint128) lsh(n uint) Uint128 {
	switch {
	case n >= 128:
		return Uint128{}
	case n >= 64:
		return Uint128{Hi: u.Lo << (n - 64)}
	case n == 0:
		return u
	}
	return Uint128{Hi: u.Hi<<n | u.Lo>>(64-n), Lo: u.Lo << n}
}

func (u Uint128) rsh(n uint) Uint128 {
	switch {
	case n >= 128:
		return Uint128{}
	case n >= 64:
		return Uint128{Lo: u.Hi >> (n - 64)}
	case n == 0:
		return u
	}
	return Uint128{Hi: u.Hi >> n, Lo: u.Lo>>n | u.Hi<<(64-n)}
}

// trailingZeros counts the low zero bits; 128 for 0.
func (u Uint128) trailingZeros() int {
	if u.Lo != 0 {
		return bits.TrailingZeros64(u.Lo)
	}
	return 64 + bits.TrailingZeros64(u.Hi)
}

func minU(a, b Uint128) Uint128 {
	if a.Less(b) {
		return a
	}
	return b
}

func maxU(a, b Uint128) Uint128 {
	if a.Less(b) {
		return b
	}
	return a
}

// pow2 returns 2^n for n < 128.
func pow2(n int) Uint128 { return Uint128{Lo: 1}.lsh(uint(n)) }

// randBelow draws uniformly from [0, n) without modulo bias; n must not be 0.
func randBelow(rng *rand.Rand, n Uint128) Uint128 {
	if n.Hi == 0 {
		return Uint128{Lo: rng.Uint64N(n.Lo)}
	}
	// Rejection sampling over the smallest power of two >= n: fewer than
	// two draws on average.
	hiMask := uint64(math.MaxUint64) >> (64 - bits.Len64(n.Hi))
	for {
		v := Uint128{Hi: rng.Uint64() & hiMask, Lo: rng.Uint64()}
		if v.Less(n) {
			return v
		}
	}
}

// Lsh returns u shifted left by n bits (0 from n >= 128).
func (u Uint128) Lsh(n uint) Uint128 { return u.lsh(n) }

// Rsh returns u shifted right by n bits (0 from n >= 128).
func (u Uint128) Rsh(n uint) Uint128 { return u.rsh(n) }

// AddrUint128 returns an address as a number: an IPv4 address in the low 32
// bits, an IPv6 address in all 128.
func AddrUint128(a netip.Addr) Uint128 { return addrInt(a) }

// Addr returns the address whose number is u (see AddrUint128): IPv4 from
// the low 32 bits when is4, else IPv6.
func (u Uint128) Addr(is4 bool) netip.Addr { return intAddr(u, is4) }
