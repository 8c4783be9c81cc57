package api

import (
	"crypto/ed25519"
	"errors"
	"slices"
	"testing"
)

// chainKeys returns n fresh key pairs.
func chainKeys(t *testing.T, n int) ([]ed25519.PublicKey, []ed25519.PrivateKey) {
	t.Helper()
	var pubs []ed25519.PublicKey
	var privs []ed25519.PrivateKey
	for range n {
		pub, priv, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		pubs, privs = append(pubs, pub), append(privs, priv)
	}
	return pubs, privs
}

func TestSigningChain(t *testing.T) {
	pub, priv := chainKeys(t, 4)
	l01, l12 := NewSigningLink(priv[0], pub[1]), NewSigningLink(priv[1], pub[2])
	forged := NewSigningLink(priv[3], pub[2]) // signed by k3, claims k0
	forged.Previous = EncodeSigningKey(pub[0])
	loop := NewSigningLink(priv[2], pub[0])
	// Forks: k0 endorses k1 and k3 (a dead end), k2 is endorsed by k1 and
	// by k3.
	l03, l32 := NewSigningLink(priv[0], pub[3]), NewSigningLink(priv[3], pub[2])
	tests := []struct {
		name     string
		chain    *SigningChain
		from, to int
		reaches  bool
		previous []int // Previous(to)
		verifies bool
	}{
		{"no chain, same key", nil, 0, 0, true, nil, true},
		{"no chain, another key", nil, 0, 1, false, nil, true},
		{"one link", &SigningChain{Links: []SigningLink{l01}}, 0, 1, true, []int{0}, true},
		{"one link, backwards", &SigningChain{Links: []SigningLink{l01}}, 1, 0, false, nil, true},
		{"two links, any order", &SigningChain{Links: []SigningLink{l12, l01}}, 0, 2, true, []int{1, 0}, true},
		{"a gap", &SigningChain{Links: []SigningLink{l12}}, 0, 2, false, []int{1}, true},
		{"a forged link", &SigningChain{Links: []SigningLink{forged}}, 0, 2, false, nil, false},
		{"a loop ends", &SigningChain{Links: []SigningLink{l01, l12, loop}}, 0, 3, false, nil, true},
		// Before Reaches and Previous searched every verifying link, they
		// followed the first one: a dead end hid the path.
		{"a fork, the first link a dead end", &SigningChain{Links: []SigningLink{l03, l01, l12}}, 0, 2, true, []int{1, 0}, true},
		{"a fork backwards, nearest first", &SigningChain{Links: []SigningLink{l32, l12, l01}}, 0, 2, true, []int{3, 1, 0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.chain.Reaches(pub[tt.from], pub[tt.to]); got != tt.reaches {
				t.Errorf("Reaches(k%d, k%d) = %v, want %v", tt.from, tt.to, got, tt.reaches)
			}
			var want []ed25519.PublicKey
			for _, i := range tt.previous {
				want = append(want, pub[i])
			}
			got := tt.chain.Previous(pub[tt.to])
			if !slices.EqualFunc(got, want, func(a, b ed25519.PublicKey) bool { return a.Equal(b) }) {
				t.Errorf("Previous(k%d) = %d keys, want %v", tt.to, len(got), tt.previous)
			}
			if err := tt.chain.Verify(); (err == nil) != tt.verifies || (err != nil && !errors.Is(err, ErrSigningChain)) {
				t.Errorf("Verify: %v, want verifies=%v", err, tt.verifies)
			}
		})
	}
}
