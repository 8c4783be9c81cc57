package ring

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Parts of a ring for gossip in proportion to change.
//
// Every part of the replicated state joins entry by entry (raw tokens by
// position, leases by prefix and owner, lease sets and tombstones by
// owner), so any subset of a ring's entries is itself a valid ring, below
// the whole in the join order, and merging subsets that together hold every
// entry gives what merging the whole gives. A delta (the entries a change
// wrote) and a bucket (the entries of some owners) are such subsets; both
// keep the ring's first token, which every encoding needs and which is one
// of the ring's own entries.

// Delta returns the entries of r that since lacks or holds older: raw
// tokens whose value beats since's at their position, leases that beat
// since's of their key (and are not below since's lease set of their
// owner), lease sets and tombstones of a higher version.
// Merging the delta into any ring at or above since gives what merging r
// gives. ok is false when since holds all of r. A nil since, or one of
// another universe, gives all of r.
func (r *Ring) Delta(since *Ring) (delta *Ring, ok bool) {
	if since == nil || since.u != r.u {
		return r.Clone(), true
	}
	var raw []rawToken
	j := 0
	for _, t := range r.st.raw {
		for j < len(since.st.raw) && since.st.raw[j].start.Less(t.start) {
			j++
		}
		if j < len(since.st.raw) && since.st.raw[j].start == t.start && !t.beats(since.st.raw[j]) {
			continue
		}
		raw = append(raw, t)
	}
	var leases []leaseEntry
	j = 0
	for _, l := range r.st.leases {
		for j < len(since.st.leases) && since.st.leases[j].keyLess(l) {
			j++
		}
		if j < len(since.st.leases) && since.st.leases[j].sameKey(l) && !l.beats(since.st.leases[j]) {
			continue
		}
		if l.index < tombIndex(since.st.sets, l.owner) {
			continue // since holds a newer lease set of its owner
		}
		leases = append(leases, l)
	}
	newer := func(mine, theirs []Tombstone) []Tombstone {
		var out []Tombstone
		for _, t := range mine {
			if t.Version > tombIndex(theirs, t.Owner) {
				out = append(out, t)
			}
		}
		return out
	}
	sets, tombs := newer(r.st.sets, since.st.sets), newer(r.st.tombs, since.st.tombs)
	if len(raw)+len(leases)+len(sets)+len(tombs) == 0 {
		return nil, false
	}
	return r.subset(raw, leases, sets, tombs), true
}

// subset builds the ring of some of r's entries, each list sorted as r's,
// adding r's first token when raw lacks it.
func (r *Ring) subset(raw []rawToken, leases []leaseEntry, sets, tombs []Tombstone) *Ring {
	if len(raw) == 0 || !raw[0].start.IsZero() {
		raw = slices.Insert(raw, 0, r.st.raw[0])
	}
	s := &Ring{u: r.u}
	s.st = s.derive(raw, leases, sets, tombs)
	return s
}

// Owners counts the agents r names (in tokens, leases, lease sets or
// tombstones): what sizes its buckets.
func (r *Ring) Owners() int { return len(r.owners()) }

// bucketOf is the bucket (of n, a power of two) of an owner's entries; raw
// tokens of nobody are in the bucket of "".
func bucketOf(owner string, n int) int {
	return int(mix64(fnv64([]byte(owner))) & uint64(n-1))
}

// mix64 is MurmurHash3's 64-bit finalizer: FNV's low bits depend only on
// the low bits of the input bytes, and agent ids that differ in a few
// characters would crowd into a few buckets.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// BucketHashes hashes r's entries into n buckets (n a power of two, at
// least 1) by owner: per bucket, the XOR of a 64-bit hash of each entry.
// Two rings hold the same entries of a bucket's owners exactly when (but
// for hash collisions) the bucket's hashes are equal.
func (r *Ring) BucketHashes(n int) ([]uint64, error) {
	if n < 1 || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: %d buckets: want a power of two", ErrInvalid, n)
	}
	out := make([]uint64, n)
	r.eachEntry(func(owner string, h uint64) { out[bucketOf(owner, n)] ^= h })
	return out, nil
}

// InBuckets returns the entries of r in the given buckets of n (with r's
// first token): what one peer sends another whose buckets differ.
func (r *Ring) InBuckets(n int, buckets []int) (*Ring, error) {
	if n < 1 || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: %d buckets: want a power of two", ErrInvalid, n)
	}
	want := make([]bool, n)
	for _, b := range buckets {
		if b < 0 || b >= n {
			return nil, fmt.Errorf("%w: bucket %d of %d", ErrInvalid, b, n)
		}
		want[b] = true
	}
	cache := map[string]bool{}
	in := func(owner string) bool {
		v, ok := cache[owner]
		if !ok {
			v = want[bucketOf(owner, n)]
			cache[owner] = v
		}
		return v
	}
	var raw []rawToken
	for _, t := range r.st.raw {
		if in(t.owner) {
			raw = append(raw, t)
		}
	}
	var leases []leaseEntry
	for _, l := range r.st.leases {
		if in(l.owner) {
			leases = append(leases, l)
		}
	}
	pick := func(ts []Tombstone) []Tombstone {
		var out []Tombstone
		for _, t := range ts {
			if in(t.Owner) {
				out = append(out, t)
			}
		}
		return out
	}
	return r.subset(raw, leases, pick(r.st.sets), pick(r.st.tombs)), nil
}

// eachEntry calls f with the owner and the hash of every entry of the
// replicated state. The hash covers the entry's kind and every field, so
// that the same entry hashes alike on every peer.
func (r *Ring) eachEntry(f func(owner string, h uint64)) {
	var b []byte
	for _, t := range r.st.raw {
		b = appendU128(append(b[:0], 't'), t.start)
		b = binary.AppendUvarint(b, t.version)
		b = appendU128(b, t.free)
		f(t.owner, fnv64(append(b, t.owner...)))
	}
	for _, l := range r.st.leases {
		b = appendU128(append(b[:0], 'l'), l.start)
		b = binary.AppendUvarint(append(b, byte(l.bits)), l.index)
		f(l.owner, fnv64(append(b, l.owner...)))
	}
	owned := func(kind byte, ts []Tombstone) {
		for _, t := range ts {
			b = binary.AppendUvarint(append(b[:0], kind), t.Version)
			f(t.Owner, fnv64(append(b, t.Owner...)))
		}
	}
	owned('s', r.st.sets)
	owned('d', r.st.tombs)
}

// fnv64 is 64-bit FNV-1a: the same on every peer and cheap enough to hash
// every entry of a ring of thousands of agents each anti-entropy round.
func fnv64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}
