package ring

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// fuzzSeeds are encodings of a few real rings.
func fuzzSeeds(f *testing.F) [][]byte {
	f.Helper()
	var out [][]byte
	out = append(out, validEnc().bytes())
	r := newRing(f, "10.0.0.0/16")
	out = append(out, r.Encode())
	mustSeed(f, r, []Lease{{"a", pfx(f, "10.0.1.0/24"), 5}, {"b", pfx(f, "10.0.2.0/24"), 6}}, []Tombstone{{"c", 3}})
	out = append(out, r.Encode())
	if err := r.Grant("a", "b", pfx(f, "10.0.1.64/26")); err != nil {
		f.Fatal(err)
	}
	out = append(out, r.Encode())
	mustSeed(f, r, nil, []Tombstone{{"a", 9}})
	out = append(out, r.Encode())
	ov := newRing(f, "10.0.0.0/16")
	if _, err := ov.SeedSets([]LeaseSet{{"d", 5, []netip.Prefix{pfx(f, "10.0.1.0/25"), pfx(f, "10.0.1.128/25")}}}, nil); err != nil {
		f.Fatal(err)
	}
	if err := ov.Grant("d", "r", pfx(f, "10.0.1.96/27")); err != nil {
		f.Fatal(err)
	}
	out = append(out, ov.Encode())
	if _, err := ov.SeedSets([]LeaseSet{{"r", 9, []netip.Prefix{pfx(f, "10.0.1.96/27")}}, {"x", 2, nil}}, nil); err != nil {
		f.Fatal(err)
	}
	out = append(out, ov.Encode())
	if err := ov.Release("d", pfx(f, "10.0.1.0/27")); err != nil {
		f.Fatal(err)
	}
	out = append(out, ov.Encode())
	// A block in several ranges of its owner (the growth property test's
	// seed 3), released and granted whole.
	for _, to := range []string{"", "host-3"} {
		sp := spannedRing(f)
		out = append(out, sp.Encode())
		if err := give(sp, "host-1", to, pfx(f, "10.128.0.8/29")); err != nil {
			f.Fatal(err)
		}
		out = append(out, sp.Encode())
	}
	hr := holeRanges(f)
	if err := hr.Grant("a", "b", pfx(f, "10.0.0.36/30")); err != nil {
		f.Fatal(err)
	}
	out = append(out, hr.Encode())
	v6 := newRing(f, "fd00::/48")
	mustSeed(f, v6, []Lease{{"a", pfx(f, "fd00:0:0:1::/64"), 1}}, nil)
	out = append(out, v6.Encode())
	// Signed claims: a grant and free counts with their writer's signatures.
	signed := mustAllocator(f, "a", "10.0.0.0/16")
	signed.SetSigner(signerOf(claimKeys("a")["a"]))
	mustSeedAllocator(f, signed, []Lease{{"a", pfx(f, "10.0.1.0/24"), 5}})
	if err := signed.Grant("b", pfx(f, "10.0.1.64/26")); err != nil {
		f.Fatal(err)
	}
	out = append(out, signed.EncodeRing())
	// The same grant in two other overlays, one of the other family, at
	// the same offsets: what a replay from another overlay would bring.
	for _, u := range [][3]string{{"10.1.0.0/16", "10.1.1.0/24", "10.1.1.64/26"}, {"fd00::/112", "fd00::100/120", "fd00::140/122"}} {
		out = append(out, grantIn(f, u[0], u[1], u[2]).Encode())
	}
	return out
}

func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte{})
	f.Add([]byte{2, 4, 10, 0, 0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode error %v is not ErrInvalid", err)
			}
			return
		}
		if !bytes.Equal(r.Encode(), b) {
			t.Fatalf("accepted a non-canonical encoding:\n%x\n%x", b, r.Encode())
		}
		if changed, err := r.Clone().Merge(r); err != nil || changed {
			t.Fatalf("self merge = %v, %v", changed, err)
		}
		toks := r.Tokens()
		for i := 1; i < len(toks); i++ {
			if toks[i-1].Start.Compare(toks[i].Start) >= 0 {
				t.Fatalf("view not sorted: %v", r)
			}
		}
		for _, tk := range toks {
			if o, ok := r.Owner(tk.Start); !ok || o != tk.Owner {
				t.Fatalf("Owner(%v) = %q, %v; token says %q", tk.Start, o, ok, tk.Owner)
			}
		}
	})
}

func FuzzMerge(f *testing.F) {
	seeds := fuzzSeeds(f)
	for _, a := range seeds {
		for _, b := range seeds {
			f.Add(a, b)
		}
	}
	f.Fuzz(func(t *testing.T, ab, bb []byte) {
		a, errA := Decode(ab)
		b, errB := Decode(bb)
		if errA != nil || errB != nil {
			// An invalid remote is refused and leaves the local ring
			// untouched.
			if errA == nil {
				local := a.Clone()
				if _, err := local.Merge(b); err == nil || !bytes.Equal(local.Encode(), ab) {
					t.Fatalf("merge of an invalid ring: %v", err)
				}
			}
			return
		}
		x := a.Clone()
		_, err1 := x.Merge(b)
		y := b.Clone()
		_, err2 := y.Merge(a)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("merge errors differ by direction: %v vs %v", err1, err2)
		}
		if err1 != nil {
			if !bytes.Equal(x.Encode(), ab) {
				t.Fatalf("refused merge changed the ring")
			}
			return
		}
		if !bytes.Equal(x.Encode(), y.Encode()) {
			t.Fatalf("merge not commutative:\n%v\n%v", x, y)
		}
		if _, err := Decode(x.Encode()); err != nil {
			t.Fatalf("merge produced an invalid ring: %v", err)
		}
		if changed, err := x.Merge(b); err != nil || changed {
			t.Fatalf("merge not idempotent: %v, %v", changed, err)
		}
		// What a admits of b is tokens a holds already (a no-op: the
		// first one included) and b's tokens whose writer a's leases name.
		admitted, refused := a.Admit(b, func(Claim) (string, bool) { return "", true })
		if len(admitted.st.leases)+len(admitted.st.sets)+len(admitted.st.tombs) != 0 {
			t.Fatalf("admitted leases from a peer: %v", admitted)
		}
		if admitted.u != a.u {
			t.Fatalf("admitted a ring of %v into %v", admitted.u.prefix, a.u.prefix)
		}
		// A ring of another universe is refused whole: nothing of it
		// joins, and one refusal names it.
		if b.u != a.u && (len(admitted.st.raw) != 1 || !a.holdsExactly(admitted.st.raw[0]) ||
			len(refused) != 1 || refused[0].Reason != RefusedOtherUniverse || refused[0].Universe != b.u.prefix) {
			t.Fatalf("a ring of %v admitted into %v: %v, refused %+v", b.u.prefix, a.u.prefix, admitted, refused)
		}
		for _, tk := range admitted.st.raw {
			if tk != (rawToken{}) && !a.holdsExactly(tk) && (!b.holdsExactly(tk) || lesseeAt(a.st.eff, tk.start) != tk.signer) {
				t.Fatalf("admitted %+v: not b's, or not its writer's lease", tk)
			}
		}
		if _, err := Decode(admitted.Encode()); err != nil {
			t.Fatalf("admitted an invalid ring: %v", err)
		}
		// b's delta since a, merged into a, is b merged into a; the
		// entries of b's owners, all of them, are b, and b merged in
		// parts is b merged whole.
		if d, ok := b.Delta(a); ok {
			z := a.Clone()
			if _, err := z.Merge(d); err != nil || !bytes.Equal(z.Encode(), x.Encode()) {
				t.Fatalf("merging the delta (%v) differs from merging the whole:\n%v\n%v", err, z, x)
			}
		}
		if all := b.Select(func(string) bool { return true }); !all.Equal(b) {
			t.Fatalf("every owner of b is not b")
		}
		// The entries of any owners of b, merged into a, then the rest:
		// what merging b gives.
		half := func(o string) bool { return len(o)%2 == 0 }
		w := a.Clone()
		_, err1 = w.Merge(b.Select(half))
		_, err2 = w.Merge(b.Select(func(o string) bool { return !half(o) }))
		if err1 != nil || err2 != nil || !bytes.Equal(w.Encode(), x.Encode()) {
			t.Fatalf("merging b by parts (%v, %v) differs from merging the whole:\n%v\n%v", err1, err2, w, x)
		}
		// The guarded merge of a peer with allocations either refuses
		// with the state unchanged, or keeps ring and space equal.
		owners := a.Peers()
		if len(owners) == 0 {
			return
		}
		al, err := RestoreAllocator(State{Self: owners[0], Ring: ab})
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		for _, rg := range al.Owned() {
			if _, err := al.space.AllocateIn(Range{rg.Last, rg.Last}); err != nil {
				t.Fatalf("allocate %v: %v", rg.Last, err)
			}
			al.byAddr[rg.Last] = Attachment{ContainerID: rg.Last.String()}
			al.byAttach[Attachment{ContainerID: rg.Last.String()}] = rg.Last
		}
		before := al.State()
		if _, err := al.Merge(b); err != nil {
			var te *TakeoverError
			if !errors.As(err, &te) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrOtherUniverse) {
				t.Fatalf("guarded merge error %v", err)
			}
			if !bytes.Equal(al.State().Ring, before.Ring) {
				t.Fatalf("refused guarded merge changed the ring")
			}
		}
		checkInvariant(t, al)
		for _, got := range al.Allocations() {
			if o, _ := al.ring.Owner(got.Addr); o != al.self {
				t.Fatalf("allocation %v lost to %q", got.Addr, o)
			}
		}
	})
}
