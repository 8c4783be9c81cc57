package api

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"testing"
	"time"
)

// TestVerifyGrant: a grant statement verifies only as its donor signed it,
// for its cluster, before it expires, under the donor's claim key.
func TestVerifyGrant(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	donor := ed25519.NewKeyFromSeed(seed)
	seed[0] = 1
	other := ed25519.NewKeyFromSeed(seed)
	key := base64.StdEncoding.EncodeToString(donor.Public().(ed25519.PublicKey))
	now := time.Unix(1_800_000_000, 0)
	base := GrantReport{Overlay: "carve", Prefix: "10.128.1.0/25", Donor: "h2", Recipient: "h1", RequestID: "r1", Expires: now.Add(time.Hour).Unix()}
	signed := func(k ed25519.PrivateKey, g GrantReport, cluster string) GrantReport {
		SignGrant(k, &g, cluster)
		return g
	}
	tests := []struct {
		name string
		g    GrantReport
		key  string
		want error
	}{
		{"valid", signed(donor, base, "c1"), key, nil},
		{"unsigned", base, key, ErrGrantUnsigned},
		{"another key", signed(other, base, "c1"), key, ErrGrantBadSignature},
		{"another cluster", signed(donor, base, "c2"), key, ErrGrantBadSignature},
		{"no key", signed(donor, base, "c1"), "", ErrGrantBadSignature},
		{"not base64", func() GrantReport { g := signed(donor, base, "c1"); g.DonorSignature = "!"; return g }(), key, ErrGrantBadSignature},
		{"expired", func() GrantReport { g := base; g.Expires = now.Unix(); return signed(donor, g, "c1") }(), key, ErrGrantExpired},
	}
	for _, field := range []func(*GrantReport){
		func(g *GrantReport) { g.Prefix = "10.128.1.0/24" },
		func(g *GrantReport) { g.Recipient = "h3" },
		func(g *GrantReport) { g.Donor = "h3" },
		func(g *GrantReport) { g.Overlay = "other" },
		func(g *GrantReport) { g.RequestID = "r2" },
		func(g *GrantReport) { g.Expires++ },
	} {
		g := signed(donor, base, "c1")
		field(&g)
		tests = append(tests, struct {
			name string
			g    GrantReport
			key  string
			want error
		}{"a field changed after signing", g, key, ErrGrantBadSignature})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyGrant(tt.g, tt.key, "c1", now)
			if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("VerifyGrant = %v, want %v", err, tt.want)
			}
		})
	}
}
