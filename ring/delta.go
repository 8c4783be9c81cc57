package ring

import (
	"encoding/binary"
	"slices"
)

// Parts of a ring for gossip in proportion to change (package antientropy
// runs the protocol over EachEntry and Select).
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
// tombstones): what sizes its anti-entropy buckets.
func (r *Ring) Owners() int { return len(r.owners()) }

// Select returns the entries of r whose owner keep keeps (with r's first
// token; raw tokens of nobody have the owner ""): the part of a ring one
// peer sends another whose entries of those owners differ.
func (r *Ring) Select(keep func(owner string) bool) *Ring {
	var raw []rawToken
	for _, t := range r.st.raw {
		if keep(t.owner) {
			raw = append(raw, t)
		}
	}
	var leases []leaseEntry
	for _, l := range r.st.leases {
		if keep(l.owner) {
			leases = append(leases, l)
		}
	}
	pick := func(ts []Tombstone) []Tombstone {
		var out []Tombstone
		for _, t := range ts {
			if keep(t.Owner) {
				out = append(out, t)
			}
		}
		return out
	}
	return r.subset(raw, leases, pick(r.st.sets), pick(r.st.tombs))
}

// EachEntry calls f with the owner and a canonical encoding of every entry
// of the replicated state: its kind and every field, so that the same
// entry encodes alike on every peer (anti-entropy hashes it). entry is
// valid only during the call.
func (r *Ring) EachEntry(f func(owner string, entry []byte)) {
	b := r.eachClaimEntry(f)
	for _, l := range r.st.leases {
		b = appendU128(append(b[:0], 'l'), l.start)
		b = binary.AppendUvarint(append(b, byte(l.bits)), l.index)
		b = append(b, l.owner...)
		f(l.owner, b)
	}
	owned := func(kind byte, ts []Tombstone) {
		for _, t := range ts {
			b = binary.AppendUvarint(append(b[:0], kind), t.Version)
			b = append(b, t.Owner...)
			f(t.Owner, b)
		}
	}
	owned('s', r.st.sets)
	owned('d', r.st.tombs)
}

// EachClaimEntry is EachEntry of the raw tokens only: the claims peers
// gossip (leases come from the masters' records, never from a peer).
func (r *Ring) EachClaimEntry(f func(owner string, entry []byte)) { r.eachClaimEntry(f) }

// eachClaimEntry calls f for every raw token (its start, version, free
// count, owner and signer) and returns its buffer for reuse.
func (r *Ring) eachClaimEntry(f func(owner string, entry []byte)) []byte {
	var b []byte
	for _, t := range r.st.raw {
		b = appendU128(append(b[:0], 't'), t.start)
		b = binary.AppendUvarint(b, t.version)
		b = appendU128(b, t.free)
		b = binary.AppendUvarint(b, uint64(len(t.owner)))
		b = append(b, t.owner...)
		b = append(b, t.signer...)
		f(t.owner, b)
	}
	return b
}

// Claims returns the raw tokens of r alone: what a peer gossips of its
// ring (Admit refuses leases, lease sets and tombstones from a peer).
func (r *Ring) Claims() *Ring { return r.subset(slices.Clone(r.st.raw), nil, nil, nil) }
