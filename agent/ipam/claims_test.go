package ipam

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/ipam/claimkeys"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// claimsRefused reads carve_agent_ring_claims_refused_total{reason}.
func claimsRefused(t *testing.T, nd *node, reason string) float64 {
	t.Helper()
	v, _ := gaugeIn(t, nd.reg, "carve_agent_ring_claims_refused_total", map[string]string{"reason": reason})
	return v
}

// forgedClaims is a ring message giving half of b's first /27 to c, as a
// writer that leases it at version would write it, signed with key (nil:
// unsigned).
func forgedClaims(t *testing.T, writer string, version uint64, key ed25519.PrivateKey) []byte {
	t.Helper()
	return forgedClaimsIn(t, "10.128", writer, version, key)
}

// forgedClaimsIn is forgedClaims in the universe net.0.0/24, sent as
// overlay carve's ring (10.128.0.0/24): at the same offsets, in another
// overlay's space when net is not 10.128.
func forgedClaimsIn(t *testing.T, net, writer string, version uint64, key ed25519.PrivateKey) []byte {
	t.Helper()
	a, err := ring.NewAllocator(writer, netip.MustParsePrefix(net+".0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if key != nil {
		a.SetSigner(func(msg []byte) []byte { return ed25519.Sign(key, msg) })
	}
	if _, err := a.SeedSets([]ring.LeaseSet{{Owner: writer, Version: version, Prefixes: []netip.Prefix{netip.MustParsePrefix(net + ".0.64/26")}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Grant("c", netip.MustParsePrefix(net+".0.64/28")); err != nil {
		t.Fatal(err)
	}
	msg, err := json.Marshal(ipamwire.RingMessage{ClusterID: "c1", Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: a.Ring().Claims().Encode()}}})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// TestForgedClaimsChangeNothing: ring messages claiming b's space (by
// anyone but b with b's key, or past b's record) change no agent's ring
// and are counted by reason; b's own signed word counts.
func TestForgedClaimsChangeNothing(t *testing.T) {
	c := newCluster(t, 21, GrowthConfig{IdleReturn: -1})
	for _, id := range []string{"a", "b", "c"} {
		c.start(id, t.TempDir(), "")
	}
	c.gossipRounds()
	a := c.nodes["a"]
	b, av := c.nodes["b"].svc.view.Self.Version, c.nodes["a"].svc.view.Self.Version
	owner := func() string {
		a.svc.mu.Lock()
		defer a.svc.mu.Unlock()
		o, _ := a.svc.overlays["carve"].Alloc[0].Ring().Owner(netip.MustParsePrefix("10.128.0.64/28").Addr())
		return o
	}
	_, stranger, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each forged grant writes two tokens; one at a position where b's
	// own token beats it (a's, below b's version) is no new refusal.
	tests := []struct {
		name    string
		msg     []byte
		reason  string // "" : accepted
		refused float64
		owner   string
	}{
		{"unsigned, in b's name", forgedClaims(t, "b", b, nil), claimkeys.ReasonUnsigned, 2, "b"},
		{"b's name, another key", forgedClaims(t, "b", b, stranger), claimkeys.ReasonBadSignature, 2, "b"},
		{"a's own key in b's lease", forgedClaims(t, "a", av, claimKeyOf("a")), ring.RefusedNotLessee, 1, "b"},
		{"b's key, past b's record", forgedClaims(t, "b", b+1000, claimKeyOf("b")), ring.RefusedRecordAhead, 2, "b"},
		{"an unknown writer", forgedClaims(t, "x", b, stranger), ring.RefusedNotLessee, 2, "b"},
		{"b's own word in another overlay, replayed", forgedClaimsIn(t, "10.129", "b", b, claimKeyOf("b")), ring.RefusedOtherUniverse, 1, "b"},
		{"b's own word", forgedClaims(t, "b", b, claimKeyOf("b")), "", 0, "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := claimsRefused(t, a, tt.reason)
			if _, err := a.svc.gossip.Receive("", tt.msg); err != nil {
				t.Fatal(err)
			}
			if tt.reason != "" {
				if got := claimsRefused(t, a, tt.reason); got != before+tt.refused {
					t.Errorf("refusals{reason=%q} = %v, want %v", tt.reason, got, before+tt.refused)
				}
			}
			if got := owner(); got != tt.owner {
				t.Errorf("owner of 10.128.0.64/28 = %q, want %q", got, tt.owner)
			}
		})
	}
}

// TestSpaceRequestSigned: a donor answers only a request its sender
// signed with the key of its record.
func TestSpaceRequestSigned(t *testing.T) {
	c := newCluster(t, 22, GrowthConfig{IdleReturn: -1})
	c.start("a", t.TempDir(), "")
	c.start("b", t.TempDir(), "")
	a, b := c.nodes["a"].svc, c.nodes["b"].svc
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: "c1", From: "b", ID: "r1", Overlay: "carve", Family: "4", Bits: 27}
	signed := req
	b.claims.SignSpaceRequest(&signed)
	forged := req
	forged.Sig = api.Sign(claimKeyOf("c"), ipamwire.SpaceRequestSigningBytes(req))
	tampered := signed
	tampered.Bits = 26
	for _, tt := range []struct {
		name   string
		m      ipamwire.SpaceMessage
		reason string
	}{
		{"signed by its sender", signed, ""},
		{"unsigned", req, claimkeys.ReasonUnsigned},
		{"signed by another", forged, claimkeys.ReasonBadSignature},
		{"changed after signing", tampered, claimkeys.ReasonBadSignature},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a.mu.Lock()
			reason, ok := a.claims.CheckSpaceRequest(tt.m)
			a.mu.Unlock()
			if ok != (tt.reason == "") || reason != tt.reason {
				t.Fatalf("check = %q, %v; want %q", reason, ok, tt.reason)
			}
		})
	}
}

// TestHonestGrowthRefusesNothing: grants through the ring, their reports,
// the masters recording them and the blocks given back cost no refusal
// but record_ahead (a peer's record not seen yet).
func TestHonestGrowthRefusesNothing(t *testing.T) {
	c, _ := grantedCluster(t, 23, GrowthConfig{IdleReturn: 50 * time.Millisecond})
	reports := c.masters.reported()
	if len(reports) != 1 || reports[0].DonorSignature == "" {
		t.Fatalf("grant reports %+v, want one with its donor's signature", reports)
	}
	if err := api.VerifyGrant(api.GrantReport{Overlay: reports[0].Overlay, Prefix: reports[0].Prefix.String(), Donor: reports[0].Donor,
		Recipient: reports[0].Recipient, RequestID: reports[0].RequestID, Expires: reports[0].Expires, DonorSignature: reports[0].DonorSignature},
		encodeKey(claimKeyOf(reports[0].Donor)), "c1", time.Now()); err != nil {
		t.Fatalf("the reported grant does not verify as the masters check it: %v", err)
	}
	recordGrant(t, c, reports[0])
	for _, nd := range c.nodes {
		for _, r := range claimkeys.Reasons() {
			if r == ring.RefusedRecordAhead {
				continue
			}
			if got := claimsRefused(t, nd, r); got != 0 {
				t.Errorf("%s refused %v claims as %s", nd.id, got, r)
			}
		}
	}
}

// TestClaimKeyReplaced: a donor restarted with a new claim key signs its
// own ring claims again with it, the grant it persisted included (peers
// verify under the key of its current record only).
func TestClaimKeyReplaced(t *testing.T) {
	c, dirB := grantedCluster(t, 24, GrowthConfig{IdleReturn: -1})
	c.stop("b")
	old, newKey := claimKeyOf("b"), claimKeyOf("b-rotated")
	svc, err := New(Config{AgentID: "b", DB: openDB(t, dirB), Logger: testLogger(), ClaimKey: newKey})
	if err != nil {
		t.Fatal(err)
	}
	svc.Sync(growthView("b"))
	svc.mu.Lock()
	r := svc.overlays["carve"].Alloc[0].Ring()
	svc.mu.Unlock()
	// A peer of b's record checks every claim of b's ring.
	local, _ := ring.NewRing(r.Universe())
	self := growthSelf("b")
	if _, err := local.SeedSets([]ring.LeaseSet{{Owner: "b", Version: self.Version, Prefixes: []netip.Prefix{netip.MustParsePrefix(self.Overlays[0].Subnet)}}}, nil); err != nil {
		t.Fatal(err)
	}
	checked := map[string]int{}
	_, refused := local.Admit(r.Claims(), func(cl ring.Claim) (string, bool) {
		checked[cl.Owner]++
		if ed25519.Verify(newKey.Public().(ed25519.PublicKey), cl.Msg, cl.Sig) {
			return "", true
		}
		if ed25519.Verify(old.Public().(ed25519.PublicKey), cl.Msg, cl.Sig) {
			return "old_key", false
		}
		return "bad_signature", false
	})
	var bad []string
	for _, rf := range refused {
		if rf.Claim.Signer == "b" {
			bad = append(bad, fmt.Sprintf("%s at %s (owner %s)", rf.Reason, rf.Claim.Start, rf.Claim.Owner))
		}
	}
	if checked["a"] == 0 || len(bad) != 0 {
		t.Fatalf("b's claims checked by owner %v, refused %v; want b's grant to a among them, each signed with the new key", checked, bad)
	}
}

// encodeKey is a claim key's public half as records carry it.
func encodeKey(k ed25519.PrivateKey) string {
	return api.EncodeSigningKey(k.Public().(ed25519.PublicKey))
}
