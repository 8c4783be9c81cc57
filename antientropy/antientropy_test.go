package antientropy

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// replica is a test set: per key, named entries with a version; a merge
// keeps the higher version of each entry (a CRDT, as the membership's and
// the rings' merges are).
type replica map[string]map[string]int

func (r replica) entries() Entries {
	return func(yield func(string, uint64)) {
		for k, es := range r {
			for name, v := range es {
				yield(k, Hash(fmt.Appendf(nil, "%s/%s/%d", k, name, v)))
			}
		}
	}
}

func (r replica) merge(o replica) {
	for k, es := range o {
		if r[k] == nil {
			r[k] = map[string]int{}
		}
		for name, v := range es {
			if v > r[k][name] {
				r[k][name] = v
			}
		}
	}
}

// pick is the part of r whose keys sel selects: what a push carries.
func (r replica) pick(sel func(string) bool) replica {
	out := replica{}
	for k, es := range r {
		if sel(k) {
			out[k] = maps.Clone(es)
		}
	}
	return out
}

func (r replica) clone() replica {
	out := replica{}
	out.merge(r)
	return out
}

func randomReplica(rng *rand.Rand, keys int) replica {
	r := replica{}
	for i := range keys {
		k := fmt.Sprintf("agent-%d", i)
		r[k] = map[string]int{}
		for j := range rng.IntN(3) + 1 {
			r[k][fmt.Sprint("e", j)] = rng.IntN(5) + 1
		}
	}
	return r
}

// diverge changes a few entries of r: newer versions and new keys.
func diverge(rng *rand.Rand, r replica, changes int) {
	for range changes {
		k := fmt.Sprintf("agent-%d", rng.IntN(len(r)+5))
		if r[k] == nil {
			r[k] = map[string]int{}
		}
		r[k][fmt.Sprint("e", rng.IntN(4))] += rng.IntN(3) + 1
	}
}

// round runs the protocol from a (the digest's sender) to b and returns
// the bytes it moved.
func round(t *testing.T, a, b replica) int {
	t.Helper()
	moved := 8 // the digest
	if Digest(a.entries()) == Digest(b.entries()) {
		return moved
	}
	// 2. b answers with its bucket hashes.
	n := BucketCount(len(b))
	bh, err := BucketHashes(b.entries(), n)
	if err != nil {
		t.Fatal(err)
	}
	wire := bh.Encode()
	moved += len(wire)
	theirs, err := DecodeBuckets(wire)
	if err != nil {
		t.Fatal(err)
	}
	// 3. a pushes the buckets that differ.
	mine, err := BucketHashes(a.entries(), len(theirs))
	if err != nil {
		t.Fatal(err)
	}
	differ, err := Differ(mine, theirs)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := Selector(n, differ)
	if err != nil {
		t.Fatal(err)
	}
	push := a.pick(sel)
	moved += len(fmt.Sprint(push))
	b.merge(push)
	// 4. b pushes back where it still differs.
	back, err := StillDiffer(b.entries(), push.entries(), n, differ)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) > 0 {
		sel, err := Selector(n, back)
		if err != nil {
			t.Fatal(err)
		}
		pb := b.pick(sel)
		moved += len(fmt.Sprint(pb))
		a.merge(pb)
	}
	return moved
}

func TestRoundConverges(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 17))
			a := randomReplica(rng, rng.IntN(400))
			b := a.clone()
			diverge(rng, a, rng.IntN(6))
			diverge(rng, b, rng.IntN(6))
			want := a.clone()
			want.merge(b)
			round(t, a, b)
			if Digest(a.entries()) != Digest(want.entries()) || Digest(b.entries()) != Digest(want.entries()) {
				t.Fatalf("seed %d: one round left the copies apart:\na=%v\nb=%v\nwant %v", seed, a, b, want)
			}
		})
	}
}

func TestRoundInProportionToChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	a := randomReplica(rng, 5000)
	b := a.clone()
	whole := len(fmt.Sprint(a))
	if got := round(t, a, b); got != 8 {
		t.Errorf("equal sets moved %d bytes, want the 8-byte digest alone", got)
	}
	diverge(rng, a, 1)
	got := round(t, a, b)
	if got > whole/20 {
		t.Errorf("one change moved %d bytes, a twentieth of the whole set is %d", got, whole/20)
	}
	if Digest(a.entries()) != Digest(b.entries()) {
		t.Error("one round did not repair one change")
	}
}

func TestDigestIsTheXOROfBuckets(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	r := randomReplica(rng, 300)
	for _, n := range []int{1, 2, 16, 256, MaxBuckets} {
		bh, err := BucketHashes(r.entries(), n)
		if err != nil {
			t.Fatal(err)
		}
		var x uint64
		for _, h := range bh {
			x ^= h
		}
		if x != Digest(r.entries()) || bh.Digest() != x {
			t.Errorf("n=%d: XOR of bucket hashes %x (Buckets.Digest %x), digest %x", n, x, bh.Digest(), Digest(r.entries()))
		}
	}
}

// Similar agent ids (as generated ids are) spread over every bucket, so
// that a push of one bucket stays a small part of the set: plain FNV put
// 5,000 of them into only 64 of 256.
func TestBucketSpread(t *testing.T) {
	for _, format := range []string{"%08x-5c1e-4f7a-9d2b-%012x", "agent-%06d%.0d", "agent-%04d%.0d"} {
		const ids, n = 5000, 256
		count := make([]int, n)
		for i := range ids {
			count[BucketOf(fmt.Sprintf(format, i, i), n)]++
		}
		if m := slices.Max(count); slices.Min(count) == 0 || m > 3*ids/n {
			t.Errorf("%q: buckets hold %d to %d ids, want all used and none above %d", format, slices.Min(count), m, 3*ids/n)
		}
	}
}

func TestBucketCount(t *testing.T) {
	for _, tc := range []struct{ keys, want int }{
		{0, 1}, {16, 1}, {17, 2}, {5000, 256}, {100000, DefaultMaxBuckets},
	} {
		if got := BucketCount(tc.keys); got != tc.want {
			t.Errorf("BucketCount(%d) = %d, want %d", tc.keys, got, tc.want)
		}
	}
}

func TestInvalidMessagesRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"count not a power of two", ValidCount(3)},
		{"no bucket", ValidCount(0)},
		{"too many buckets", ValidCount(2 * MaxBuckets)},
		{"bucket out of range", ValidBuckets(4, []int{4})},
		{"negative bucket", ValidBuckets(4, []int{-1})},
		{"bucket twice", ValidBuckets(4, []int{1, 1})},
		{"odd byte count", func() error { _, err := DecodeBuckets(make([]byte, 12)); return err }()},
		{"hashes of 3 buckets", func() error { _, err := DecodeBuckets(make([]byte, 24)); return err }()},
		{"empty hashes", func() error { _, err := DecodeBuckets(nil); return err }()},
		{"counts differ", func() error { _, err := Differ(make(Buckets, 2), make(Buckets, 4)); return err }()},
		{"selector of bad buckets", func() error { _, err := Selector(8, []int{9}); return err }()},
		{"push back of bad buckets", func() error {
			_, err := StillDiffer(replica{}.entries(), replica{}.entries(), 8, []int{8})
			return err
		}()},
	} {
		if !errors.Is(tc.err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", tc.name, tc.err)
		}
	}
}

// FuzzDecodeBuckets: bucket hashes from the network never panic, and what
// decodes encodes back to the same bytes within the bounds.
func FuzzDecodeBuckets(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 8))
	f.Add(make([]byte, 24))
	f.Add(Buckets{1, 2, 3, 4}.Encode())
	f.Add(make([]byte, 8*MaxBuckets+8))
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := DecodeBuckets(raw)
		if err != nil {
			return
		}
		if len(b) > MaxBuckets || len(b)&(len(b)-1) != 0 {
			t.Fatalf("decoded %d buckets", len(b))
		}
		if !bytes.Equal(b.Encode(), raw) {
			t.Fatal("decoded bucket hashes encode to other bytes")
		}
		sel, err := Selector(len(b), slices.Collect(func(yield func(int) bool) {
			for i := range b {
				if b[i]%2 == 0 && !yield(i) {
					return
				}
			}
		}))
		if err != nil {
			t.Fatal(err)
		}
		sel("agent")
	})
}
