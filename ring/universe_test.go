package ring

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// grantIn is a ring of universe u in which a, leasing lease at Raft index
// 5, granted grant to b, every token signed with a's claim key.
func grantIn(t testing.TB, u, lease, grant string) *Ring {
	t.Helper()
	w := mustAllocator(t, "a", u)
	w.SetSigner(signerOf(claimKeys("a")["a"]))
	mustSeedAllocator(t, w, []Lease{{"a", pfx(t, lease), 5}})
	if err := w.Grant("b", pfx(t, grant)); err != nil {
		t.Fatal(err)
	}
	return w.Ring()
}

// TestAdmitOtherUniverse: a's signed grant in one overlay, replayed in a
// message for another overlay (or family) where a leases the same offsets,
// is refused as a whole: it changes no owner there (issue 26 item 2).
func TestAdmitOtherUniverse(t *testing.T) {
	keys := claimKeys("a")
	tests := []struct {
		name   string
		remote *Ring
	}{
		{"another overlay of the same size", grantIn(t, "10.0.0.0/16", "10.0.1.0/24", "10.0.1.128/25")},
		{"another overlay, larger", grantIn(t, "10.0.0.0/8", "10.0.1.0/24", "10.0.1.128/25")},
		{"another overlay, same base, smaller", grantIn(t, "10.1.0.0/20", "10.1.1.0/24", "10.1.1.128/25")},
		{"another family", grantIn(t, "fd00::/112", "fd00::100/120", "fd00::180/121")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			local := newRing(t, "10.1.0.0/16")
			mustSeedSets(t, local, []LeaseSet{{"a", 5, []netip.Prefix{pfx(t, "10.1.1.0/24")}}})
			before := local.Tokens()
			admitted, refused := local.Admit(tt.remote, checkWith(keys))
			after := local.Clone()
			if _, err := after.Merge(admitted); err != nil {
				t.Fatalf("merge of what was admitted: %v", err)
			}
			if got := ownerOf(t, after, "10.1.1.130"); got != "a" {
				t.Fatalf("10.1.1.130 is %q's after admitting a ring of %v, want a's\n%v", got, tt.remote.Universe(), after)
			}
			if !slices.Equal(after.Tokens(), before) {
				t.Fatalf("the view changed:\n%v\n%v", local, after)
			}
			if admitted.Universe() != local.Universe() {
				t.Fatalf("admitted a ring of %v into %v", admitted.Universe(), local.Universe())
			}
			if len(refused) != 1 || refused[0].Reason != RefusedOtherUniverse || refused[0].Universe != tt.remote.Universe() {
				t.Fatalf("refusals %+v, want one %s naming %v", refused, RefusedOtherUniverse, tt.remote.Universe())
			}
		})
	}
}

// TestClaimsNameTheirUniverse: a claim's signed bytes name its universe,
// so a's signed tokens moved into a ring that says it is of another
// universe (the check on the universe passes) do not verify there.
func TestClaimsNameTheirUniverse(t *testing.T) {
	keys := claimKeys("a")
	for _, u := range []string{"10.0.0.0/16", "10.1.0.0/17", "10.0.0.0/15", "fd00::/112", "::/112", "0.0.0.0/1"} {
		t.Run(u, func(t *testing.T) {
			local := newRing(t, "10.1.0.0/16")
			mustSeedSets(t, local, []LeaseSet{{"a", 5, []netip.Prefix{pfx(t, "10.1.1.0/24")}}})
			remote := grantIn(t, "10.1.0.0/16", "10.1.1.0/24", "10.1.1.128/25")
			// The same tokens as a signed them in universe u.
			other := newRing(t, u)
			signed := slices.Clone(remote.st.raw)
			for i := range signed {
				if signed[i].signer != "" {
					signed[i].sig = string(signerOf(keys["a"])(claimBytes(other.u, signed[i])))
				}
			}
			remote.st = remote.derive(signed, remote.st.leases, remote.st.sets, remote.st.tombs)
			admitted, refused := local.Admit(remote, checkWith(keys))
			var reasons []string
			for _, r := range refused {
				reasons = append(reasons, r.Reason)
			}
			if want := []string{"bad_signature", "bad_signature"}; !slices.Equal(reasons, want) {
				t.Fatalf("refusals %v, want %v", reasons, want)
			}
			if got := ownerOf(t, merged(t, local, admitted), "10.1.1.130"); got != "a" {
				t.Fatalf("10.1.1.130 is %q's, want a's", got)
			}
			if bytes.Equal(claimBytes(other.u, remote.st.raw[1]), claimBytes(local.u, remote.st.raw[1])) {
				t.Fatalf("the claim bytes of %v and %v are equal", other.u.prefix, local.u.prefix)
			}
		})
	}
}

// TestForgetfulAdmit: a path that skipped Admit's universe check
// (admitClaims straight) still refuses another overlay's or family's
// signed tokens: the bytes it has the check verify name the receiver's
// universe, which the signer never signed.
func TestForgetfulAdmit(t *testing.T) {
	keys := claimKeys("a")
	for _, remote := range []*Ring{
		grantIn(t, "10.0.0.0/16", "10.0.1.0/24", "10.0.1.128/25"),
		grantIn(t, "fd00::/112", "fd00::100/120", "fd00::180/121"),
	} {
		t.Run(remote.Universe().String(), func(t *testing.T) {
			local := newRing(t, "10.1.0.0/16")
			mustSeedSets(t, local, []LeaseSet{{"a", 5, []netip.Prefix{pfx(t, "10.1.1.0/24")}}})
			admitted, refused := local.admitClaims(remote, checkWith(keys))
			var reasons []string
			for _, r := range refused {
				reasons = append(reasons, r.Reason)
			}
			if want := []string{"bad_signature", "bad_signature", RefusedLease}; !slices.Equal(reasons, want) {
				t.Fatalf("refusals %v, want %v", reasons, want)
			}
			if got := ownerOf(t, merged(t, local, admitted), "10.1.1.130"); got != "a" {
				t.Fatalf("10.1.1.130 is %q's, want a's", got)
			}
		})
	}
}

// inUniverse is r's state in universe p, at the same offsets (p holds at
// least as many addresses as r's universe): the ring a peer of another
// overlay sends where the same offsets are leased to the same agents.
func inUniverse(t testing.TB, r *Ring, p netip.Prefix) *Ring {
	t.Helper()
	u, err := newUniverse(p)
	if err != nil {
		t.Fatal(err)
	}
	if u.size.Less(r.u.size) {
		t.Fatalf("%v is smaller than %v", p, r.u.prefix)
	}
	shift := p.Addr().BitLen() - r.u.prefix.Addr().BitLen()
	leases := slices.Clone(r.st.leases)
	for i := range leases {
		leases[i].bits += shift
	}
	o := &Ring{u: u}
	o.st = o.derive(slices.Clone(r.st.raw), leases, r.st.sets, r.st.tombs)
	checkValid(t, o)
	return o
}

// signedIn is r's state with every token that names a writer signed by
// that writer's key in universe p, as the writer would have signed it
// there.
func signedIn(t testing.TB, r *Ring, p netip.Prefix, keys map[string]ed25519.PrivateKey) *Ring {
	t.Helper()
	u, err := newUniverse(p)
	if err != nil {
		t.Fatal(err)
	}
	raw := slices.Clone(r.st.raw)
	for i := range raw {
		if raw[i].signer != "" {
			raw[i].sig = string(ed25519.Sign(keys[raw[i].signer], claimBytes(u, raw[i])))
		}
	}
	o := r.Clone()
	o.st = o.derive(raw, r.st.leases, r.st.sets, r.st.tombs)
	return o
}

// TestAdmitFromAnyOtherUniverse: the tokens a ring of any other universe
// brings, signed there by the writers that lease their offsets here,
// never change an owner in the receiver: not through Admit even when its
// check accepts every signature, and not through a path that forgot the
// universe check (admitClaims) with a check that verifies signatures.
// The same tokens signed in the receiver's own universe do change owners
// for some seeds (so the property is not empty).
func TestAdmitFromAnyOtherUniverse(t *testing.T) {
	others := []string{"10.0.1.0/24", "10.0.0.0/23", "10.0.0.0/16", "10.0.0.0/8", "192.168.0.0/24", "0.0.0.0/0",
		"fd00::/120", "fd00::/64", "::/120"}
	keys := claimKeys("a", "b", "c")
	acceptAll := func(Claim) (string, bool) { return "", true }
	unchanged := func(local, admitted *Ring) bool {
		return slices.Equal(merged(t, local, admitted).Tokens(), local.Tokens())
	}
	control := 0
	const seeds = 300
	for seed := uint64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 26))
		local := randomRing(t, rng)
		// The remote's writers lease what they write in local's leases:
		// local's leases with random tokens of random writers.
		content := randomRing(t, rng)
		content.st = content.derive(content.st.raw, local.st.leases, local.st.sets, local.st.tombs)
		checkValid(t, content)
		if own, _ := local.Admit(signedIn(t, content, local.u.prefix, keys), checkWith(keys)); !unchanged(local, own) {
			control++
		}
		p := pfx(t, others[rng.IntN(len(others))])
		remote := inUniverse(t, signedIn(t, content, p, keys), p)
		admitted, refused := local.Admit(remote, acceptAll)
		if !unchanged(local, admitted) {
			t.Fatalf("seed %d: a ring of %v changed owners in %v:\n%v\n%v", seed, p, local.u.prefix, local, merged(t, local, admitted))
		}
		if len(refused) != 1 || refused[0].Reason != RefusedOtherUniverse {
			t.Fatalf("seed %d: refusals %+v, want one %s", seed, refused, RefusedOtherUniverse)
		}
		if forgot, _ := local.admitClaims(remote, checkWith(keys)); !unchanged(local, forgot) {
			t.Fatalf("seed %d: past the universe check, a ring of %v changed owners in %v:\n%v\n%v", seed, p, local.u.prefix, local, merged(t, local, forgot))
		}
	}
	if control == 0 {
		t.Fatal("no seed's tokens changed an owner in their own universe: the property tests nothing")
	}
	t.Logf("seeds 1-%d: tokens of another universe changed no owner; in their own universe, %d seeds' did", seeds, control)
}

// TestClaimBytesGolden pins the signed bytes of a claim: the domain, the
// universe (its address, 4 or 16 bytes by family, and its length), then
// the token. Changing them voids every signature agents hold and makes
// agents of two versions refuse each other's claims as bad_signature
// (docs/design.md, "Attributed claims"): only on purpose, with a new
// claimDomain and an upgrade note.
func TestClaimBytesGolden(t *testing.T) {
	tk := rawToken{start: U128(0x180), owner: "b", version: 5<<32 | 1, free: U128(128), signer: "a"}
	const (
		domain = "63617276652072696e6720636c61696d20763100" // "carve ring claim v1\x00"
		token  = "00000000000000000000000000000180" + "0162" + "0000000500000001" +
			"00000000000000000000000000000080" + "0161" // start, owner b, version 5.1, free, signer a
	)
	for _, tt := range []struct{ universe, bytes string }{
		{"10.1.0.0/16", "0a010000" + "10"},
		{"fd00::/112", "fd000000000000000000000000000000" + "70"},
	} {
		u, err := newUniverse(pfx(t, tt.universe))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := hex.EncodeToString(claimBytes(u, tk)), domain+tt.bytes+token; got != want {
			t.Errorf("claim bytes in %s:\n got %s\nwant %s", tt.universe, got, want)
		}
	}
}
