package ring

import (
	"crypto/ed25519"
	"errors"
	"net/netip"
	"slices"
	"testing"
)

// claimKeys are deterministic claim keys of test peers.
func claimKeys(peers ...string) map[string]ed25519.PrivateKey {
	out := map[string]ed25519.PrivateKey{}
	for i, p := range peers {
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = byte(i + 1)
		out[p] = ed25519.NewKeyFromSeed(seed)
	}
	return out
}

// signerOf signs as peer with its key.
func signerOf(key ed25519.PrivateKey) func([]byte) []byte {
	return func(msg []byte) []byte { return ed25519.Sign(key, msg) }
}

// checkWith verifies a claim's signature under the keys.
func checkWith(keys map[string]ed25519.PrivateKey) func(Claim) (string, bool) {
	return func(c Claim) (string, bool) {
		k, ok := keys[c.Signer]
		switch {
		case len(c.Sig) == 0:
			return "unsigned", false
		case !ok:
			return "unknown_signer", false
		case !ed25519.Verify(k.Public().(ed25519.PublicKey), c.Msg, c.Sig):
			return "bad_signature", false
		}
		return "", true
	}
}

// TestAttributedView: a token counts only where its writer leases its
// start; a forged one (any version, any owner) changes nothing, and a
// lessee's token stops counting once the space is leased to another.
func TestAttributedView(t *testing.T) {
	leases := []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}, {"b", pfx(t, "10.0.2.0/24"), 6}}
	tests := []struct {
		name   string
		signer string // of every token but the first
		toks   []tok
		probe  map[string]string // address -> owner
	}{
		{"lessee's grant counts", "a", []tok{{"10.0.0.0", "", 0, 0, 0}, {"10.0.1.128", "b", 5, 1, 128}},
			map[string]string{"10.0.1.1": "a", "10.0.1.130": "b", "10.0.2.1": "b"}},
		{"forged grant at the highest version changes nothing", "a",
			[]tok{{"10.0.0.0", "", 0, 0, 0}, {"10.0.2.0", "a", maxRaftIndex, counterMask, 0}},
			map[string]string{"10.0.2.0": "b", "10.0.2.255": "b"}},
		{"forged release changes nothing", "b", []tok{{"10.0.0.0", "", 0, 0, 0}, {"10.0.1.0", "", maxRaftIndex, 1, 0}},
			map[string]string{"10.0.1.0": "a"}},
		{"a token outside every lease changes nothing", "c", []tok{{"10.0.0.0", "", 0, 0, 0}, {"10.0.9.0", "c", 9, 1, 0}},
			map[string]string{"10.0.9.0": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rawRing(t, "10.0.0.0/16", tt.toks...)
			for i := 1; i < len(r.st.raw); i++ {
				r.st.raw[i].signer = tt.signer
			}
			r.st = r.derive(r.st.raw, nil, nil, nil)
			mustSeed(t, r, leases, nil)
			for addr, want := range tt.probe {
				if got := ownerOf(t, r, addr); got != want {
					t.Errorf("owner(%s) = %q, want %q\n%v", addr, got, want, r)
				}
			}
			checkValid(t, r)
		})
	}
	// The lessee's grant stops counting when the space is leased to
	// another (the masters moved it: a return, a deletion).
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, leases, nil)
	if err := r.Grant("a", "b", pfx(t, "10.0.1.128/25")); err != nil {
		t.Fatal(err)
	}
	mustSeed(t, r, []Lease{{"c", pfx(t, "10.0.1.0/24"), 9}}, []Tombstone{{"a", 8}})
	if got := ownerOf(t, r, "10.0.1.200"); got != "c" {
		t.Fatalf("owner after the new lease = %q, want c\n%v", got, r)
	}
}

// TestOnlyTheLesseeWrites: a peer owning a range it does not lease (a
// grant the masters have not recorded) neither grants it on nor reports
// its free count: its tokens would count for nothing.
func TestOnlyTheLesseeWrites(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
	if err := r.Grant("a", "b", pfx(t, "10.0.1.128/25")); err != nil {
		t.Fatal(err)
	}
	if err := r.Grant("b", "c", pfx(t, "10.0.1.128/26")); !errors.Is(err, ErrNotLessee) {
		t.Fatalf("grant of a granted range = %v, want ErrNotLessee", err)
	}
	if err := r.Release("b", pfx(t, "10.0.1.128/25")); !errors.Is(err, ErrNotLessee) {
		t.Fatalf("release of a granted range = %v, want ErrNotLessee", err)
	}
	if changed, err := r.ReportFree("b", map[netip.Addr]Uint128{ip(t, "10.0.1.128"): U128(3)}); changed || err != nil {
		t.Fatalf("free count of a granted range = %v, %v; want no change", changed, err)
	}
	// Recorded: b leases it now, and writes.
	mustSeed(t, r, []Lease{{"b", pfx(t, "10.0.1.128/25"), 7}}, nil)
	if changed, err := r.ReportFree("b", map[netip.Addr]Uint128{ip(t, "10.0.1.128"): U128(3)}); !changed || err != nil {
		t.Fatalf("free count of a recorded grant = %v, %v; want a change", changed, err)
	}
}

// TestViewCapsFree: a raw free count beyond its range (a token inserted
// inside it later) is kept as signed and capped in the view.
func TestViewCapsFree(t *testing.T) {
	r := rawRing(t, "10.0.0.0/24", tok{"10.0.0.0", "a", 2, 0, 200}, tok{"10.0.0.16", "a", 2, 0, 0})
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.0.0/24"), 1}}, nil)
	if r.st.raw[0].free != U128(200) {
		t.Fatalf("raw free = %v, want 200 as written", r.st.raw[0].free)
	}
	if v := r.Tokens()[0]; v.Free != U128(16) {
		t.Fatalf("view free = %v, want 16", v.Free)
	}
}

// TestSignedWrites: every token a signing allocator writes names it and
// carries its signature of the claim bytes, which survive the encoding.
func TestSignedWrites(t *testing.T) {
	keys := claimKeys("a", "b")
	a := mustAllocator(t, "a", "10.0.0.0/16")
	a.SetSigner(signerOf(keys["a"]))
	mustSeedAllocator(t, a, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}})
	if err := a.Grant("b", pfx(t, "10.0.1.64/26")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SyncFree(); err != nil {
		t.Fatal(err)
	}
	d, err := Decode(a.EncodeRing())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tk := range d.st.raw {
		if tk == (rawToken{}) {
			continue
		}
		n++
		c := d.claimOf(tk)
		if why, ok := checkWith(keys)(c); !ok || c.Signer != "a" {
			t.Fatalf("token %+v: %s (signer %q)", c, why, c.Signer)
		}
	}
	if n < 2 {
		t.Fatalf("%d signed tokens, want the grant's", n)
	}
}

// TestAdmit: a received ring joins only with the tokens whose signature
// verifies and whose signer leases their start at the receiver; leases,
// lease sets and tombstones never come from a peer; each refusal is named.
func TestAdmit(t *testing.T) {
	keys := claimKeys("a", "b", "x")
	leases := []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}, {"b", pfx(t, "10.0.2.0/24"), 6}}
	local := newRing(t, "10.0.0.0/16")
	mustSeedSets(t, local, []LeaseSet{{"a", 5, []netip.Prefix{leases[0].Prefix}}, {"b", 6, []netip.Prefix{leases[1].Prefix}}})

	writer := func(self string) *Allocator {
		w := mustAllocator(t, self, "10.0.0.0/16")
		w.SetSigner(signerOf(keys[self]))
		mustSeedAllocator(t, w, leases)
		return w
	}
	forged := func(mutate func(*rawToken)) *Ring {
		w := writer("a")
		if err := w.Grant("x", pfx(t, "10.0.1.0/25")); err != nil {
			t.Fatal(err)
		}
		r := w.Ring()
		raw := slices.Clone(r.st.raw)
		for i := range raw {
			if raw[i] != (rawToken{}) {
				mutate(&raw[i])
			}
		}
		r.st = r.derive(raw, r.st.leases, r.st.sets, r.st.tombs)
		return r
	}
	tests := []struct {
		name    string
		remote  *Ring
		admit   int      // tokens admitted
		reasons []string // refusals, in order
	}{
		{"the lessee's signed grant", forged(func(*rawToken) {}), 2, nil},
		{"unsigned", forged(func(t *rawToken) { t.sig = "" }), 0, []string{"unsigned", "unsigned"}},
		{"tampered", forged(func(t *rawToken) { t.owner = "b" }), 0, []string{"bad_signature", "bad_signature"}},
		{"signed by another key", forged(func(tk *rawToken) {
			tk.sig = string(ed25519.Sign(keys["x"], claimBytes(local.u, *tk)))
		}), 0, []string{"bad_signature", "bad_signature"}},
		{"in another's lease, well signed", forged(func(tk *rawToken) {
			tk.signer = "x"
			tk.sig = string(ed25519.Sign(keys["x"], claimBytes(local.u, *tk)))
		}), 0, []string{RefusedNotLessee, RefusedNotLessee}},
		{"newer than the signer's lease set held", forged(func(tk *rawToken) {
			tk.version = 99<<32 | 1
			tk.sig = string(ed25519.Sign(keys["a"], claimBytes(local.u, *tk)))
		}), 0, []string{RefusedRecordAhead, RefusedRecordAhead}},
		{"a forged lease", func() *Ring {
			r := newRing(t, "10.0.0.0/16")
			mustSeed(t, r, []Lease{{"x", pfx(t, "10.0.2.0/24"), 99}}, []Tombstone{{"b", 98}})
			return r
		}(), 0, []string{RefusedLease}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			admitted, refused := local.Admit(tt.remote, checkWith(keys))
			var reasons []string
			for _, r := range refused {
				reasons = append(reasons, r.Reason)
			}
			if !slices.Equal(reasons, tt.reasons) {
				t.Fatalf("refusals %v, want %v", reasons, tt.reasons)
			}
			n := 0
			for _, tk := range admitted.st.raw {
				if tk != (rawToken{}) {
					n++
				}
			}
			if n != tt.admit || len(admitted.st.leases)+len(admitted.st.sets)+len(admitted.st.tombs) != 0 {
				t.Fatalf("admitted %d tokens and %d leases, want %d and none\n%v", n, len(admitted.st.leases), tt.admit, admitted)
			}
			after := local.Clone()
			if _, err := after.Merge(admitted); err != nil {
				t.Fatal(err)
			}
			if tt.admit == 0 && !slices.Equal(after.Tokens(), local.Tokens()) {
				t.Fatalf("a refused ring changed the view:\n%v\n%v", local, after)
			}
			// What was admitted once is no new refusal when it comes again.
			if _, again := after.Admit(tt.remote, checkWith(keys)); tt.admit > 0 && len(again) != 0 {
				t.Fatalf("repeat refused: %v", again)
			}
		})
	}
}

// TestSweepAfterReturn: a grantee gives a recorded grant back and the
// masters record the return; a peer that missed the return still holds
// the donor's old grant token, which counts again now that the donor
// leases the space. The donor's sweep outbids it everywhere, and the
// peers converge on the donor's ownership.
func TestSweepAfterReturn(t *testing.T) {
	keys := claimKeys("d", "r", "l")
	u := "10.0.0.0/16"
	set := func(owner string, v uint64, ps ...string) LeaseSet {
		s := LeaseSet{Owner: owner, Version: v}
		for _, p := range ps {
			s.Prefixes = append(s.Prefixes, pfx(t, p))
		}
		return s
	}
	peer := func(self string) *Allocator {
		a := mustAllocator(t, self, u)
		a.SetSigner(signerOf(keys[self]))
		if _, err := a.SeedSets([]LeaseSet{set("d", 5, "10.0.1.0/24")}, nil); err != nil {
			t.Fatal(err)
		}
		return a
	}
	d, r, l := peer("d"), peer("r"), peer("l")
	if err := d.Grant("r", pfx(t, "10.0.1.128/25")); err != nil {
		t.Fatal(err)
	}
	join := func(to *Allocator, from *Allocator) {
		t.Helper()
		admitted, _ := to.Ring().Admit(from.Ring(), checkWith(keys))
		if _, err := to.Merge(admitted); err != nil {
			t.Fatal(err)
		}
	}
	join(r, d)
	join(l, d)
	recorded := []LeaseSet{set("d", 7, "10.0.1.0/25"), set("r", 7, "10.0.1.128/25")}
	returned := []LeaseSet{set("d", 9, "10.0.1.0/24"), set("r", 9)}
	for _, a := range []*Allocator{d, r, l} {
		if _, err := a.SeedSets(recorded, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Grant("d", pfx(t, "10.0.1.128/25")); err != nil {
		t.Fatalf("return of a recorded grant: %v", err)
	}
	join(d, r) // l misses it
	for _, a := range []*Allocator{d, r, l} {
		if _, err := a.SeedSets(returned, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := l.Ring().Owner(ip(t, "10.0.1.200")); got != "r" {
		t.Fatalf("the lagging peer sees %q: the test no longer shows the stale grant", got)
	}
	if changed, err := d.Sweep(); err != nil || !changed {
		t.Fatalf("Sweep = %v, %v; want a change", changed, err)
	}
	if changed, _ := d.Sweep(); changed {
		t.Fatal("a second sweep changed the ring")
	}
	join(l, d)
	join(r, d)
	for _, a := range []*Allocator{d, r, l} {
		if got, _ := a.Ring().Owner(ip(t, "10.0.1.200")); got != "d" {
			t.Errorf("%s sees 10.0.1.200 as %q's, want d's\n%v", a.Self(), got, a.Ring())
		}
	}
	if !l.Ring().Claims().Equal(d.Ring().Claims()) || !r.Ring().Claims().Equal(d.Ring().Claims()) {
		t.Fatalf("claims differ after the sweep:\n%v\n%v\n%v", d.Ring(), r.Ring(), l.Ring())
	}
}

// TestResign: after its claim key changed, a peer signs its own tokens
// again with the new key, one version up; their view does not change.
func TestResign(t *testing.T) {
	keys := claimKeys("a", "a2")
	a := mustAllocator(t, "a", "10.0.0.0/16")
	a.SetSigner(signerOf(keys["a"]))
	mustSeedAllocator(t, a, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}})
	if err := a.Grant("b", pfx(t, "10.0.1.64/26")); err != nil {
		t.Fatal(err)
	}
	before := a.Ring().Tokens()
	newKey := map[string]ed25519.PrivateKey{"a": keys["a2"]}
	valid := func(c Claim) bool { _, ok := checkWith(newKey)(c); return ok }
	a.SetSigner(signerOf(keys["a2"]))
	if changed, err := a.Resign(valid); err != nil || !changed {
		t.Fatalf("Resign = %v, %v; want a change", changed, err)
	}
	if changed, _ := a.Resign(valid); changed {
		t.Fatal("a second Resign changed the ring")
	}
	after := a.Ring().Tokens()
	for i := range after {
		if before[i].Owner != after[i].Owner || before[i].Start != after[i].Start {
			t.Fatalf("the view changed:\n%v\n%v", before, after)
		}
	}
	for _, tk := range a.ring.st.raw {
		if tk != (rawToken{}) && !valid(a.ring.claimOf(tk)) {
			t.Fatalf("token %+v not signed with the new key", tk)
		}
	}
}
