package ring

import (
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestUint128Arithmetic(t *testing.T) {
	max64 := ^uint64(0)
	tests := []struct {
		name string
		got  Uint128
		want Uint128
	}{
		{"add carries", Uint128{0, max64}.Add(U128(1)), Uint128{1, 0}},
		{"add wraps", Uint128{max64, max64}.Add(U128(1)), Uint128{}},
		{"sub borrows", Uint128{1, 0}.Sub(U128(1)), Uint128{0, max64}},
		{"lsh across", U128(3).lsh(63), Uint128{1, 1 << 63}},
		{"lsh 64", U128(5).lsh(64), Uint128{5, 0}},
		{"lsh 128", U128(5).lsh(128), Uint128{}},
		{"rsh across", Uint128{1, 0}.rsh(1), Uint128{0, 1 << 63}},
		{"rsh 64", Uint128{7, 9}.rsh(64), U128(7)},
		{"rsh 0", Uint128{7, 9}.rsh(0), Uint128{7, 9}},
		{"rsh 128", Uint128{7, 9}.rsh(128), Uint128{}},
		{"pow2 100", pow2(100), Uint128{1 << 36, 0}},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if (Uint128{1, 0}).Cmp(Uint128{0, max64}) != 1 || U128(3).Cmp(U128(3)) != 0 || U128(2).Cmp(U128(3)) != -1 {
		t.Error("Cmp")
	}
	want, _ := new(big.Int).SetString("18446744073709551621", 10)
	if v := (Uint128{1, 5}); v.String() != want.String() || v.Big().Cmp(want) != 0 {
		t.Errorf("String = %s, want %s", v, want)
	}
	if v, ok := (Uint128{1, 5}).Uint64(); ok || v != 5 {
		t.Error("Uint64 of a wide value reported ok")
	}
	if f := (Uint128{1, 0}).Float64(); f != 18446744073709551616 {
		t.Errorf("Float64 = %v", f)
	}
	if (Uint128{0, 8}).trailingZeros() != 3 || (Uint128{8, 0}).trailingZeros() != 67 || (Uint128{}).trailingZeros() != 128 {
		t.Error("trailingZeros")
	}
}

func TestRandBelow(t *testing.T) {
	seed := uint64(5)
	rng := rand.New(rand.NewPCG(seed, 0))
	for _, n := range []Uint128{U128(1), U128(7), {1, 0}, {1, 1}, {3, 12345}, {1 << 62, 0}} {
		for range 1000 {
			if v := randBelow(rng, n); !v.Less(n) {
				t.Fatalf("randBelow(%v) = %v (seed %d)", n, v, seed)
			}
		}
	}
}
