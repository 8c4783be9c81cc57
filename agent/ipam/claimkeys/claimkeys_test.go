package claimkeys

import (
	"crypto/ed25519"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/ring"
)

func key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestCheckClaim: a claim counts only signed by its signer's record key,
// a signer the masters did not delete; without a key of its own an agent
// checks no signature.
func TestCheckClaim(t *testing.T) {
	a, b, stranger := key(t), key(t), key(t)
	deleted := map[string]bool{"gone": true}
	keys := New("a", a, func(id string) bool { return deleted[id] })
	keys.SetPeers(map[string]ed25519.PublicKey{"b": b.Public().(ed25519.PublicKey), "gone": b.Public().(ed25519.PublicKey)})
	msg := []byte("claim bytes")
	signed := func(signer string, k ed25519.PrivateKey) ring.Claim {
		return ring.Claim{Signer: signer, Msg: msg, Sig: ipamwire.SignClaims(k)(msg)}
	}
	for _, tt := range []struct {
		name   string
		c      ring.Claim
		reason string
	}{
		{"b's own", signed("b", b), ""},
		{"unsigned", ring.Claim{Signer: "b", Msg: msg}, ReasonUnsigned},
		{"b's name, another key", signed("b", stranger), ReasonBadSignature},
		{"no record", signed("x", stranger), ReasonUnknownSigner},
		{"deleted", signed("gone", b), ReasonDeletedSigner},
	} {
		reason, ok := keys.CheckClaim(tt.c)
		if ok != (tt.reason == "") || reason != tt.reason {
			t.Errorf("%s: %q, %v; want %q", tt.name, reason, ok, tt.reason)
		}
	}
	if reason, ok := New("a", nil, nil).CheckClaim(ring.Claim{Signer: "x"}); !ok {
		t.Errorf("without a claim key: refused as %q", reason)
	}
	if !keys.OwnClaimValid()(signed("a", a)) || keys.OwnClaimValid()(signed("a", stranger)) {
		t.Error("own claims judged wrongly under the current key")
	}
}

// TestGrantStatement: the donor's signed statement verifies at its
// recipient, for that grant only.
func TestGrantStatement(t *testing.T) {
	donor, recipient := key(t), key(t)
	none := func(string) bool { return false }
	d, r := New("d", donor, none), New("r", recipient, none)
	r.SetPeers(map[string]ed25519.PublicKey{"d": donor.Public().(ed25519.PublicKey)})
	p, now := netip.MustParsePrefix("10.128.0.64/27"), time.Now()
	var ans ipamwire.SpaceMessage
	ans.Expires, ans.GrantSig = d.SignGrant("c1", "carve", p, "r", "r-1", now)
	if err := r.CheckGrantStatement("c1", "carve", "d", p, "r-1", ans, now); err != nil {
		t.Errorf("the donor's statement: %v", err)
	}
	if err := r.CheckGrantStatement("c1", "carve", "d", netip.MustParsePrefix("10.128.0.0/26"), "r-1", ans, now); err == nil {
		t.Error("a statement of another block verified")
	}
}
