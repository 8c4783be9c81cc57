package ringgossip

// Ring anti-entropy, for what a broadcast missed (see
// ipamwire.RingMessage): the protocol of package antientropy over each
// served ring's entries (ring.Ring.EachEntry, keyed by owner). It reads the
// served rings through Rings.Read and keeps its caches in each ring's
// ringState.

import (
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/ring"
)

// ringEntries is a ring's claims (its raw tokens) as anti-entropy hashes
// them: each one's canonical encoding, keyed by its owner. Leases are left
// out: every agent seeds them from the masters' records, and a peer's are
// never taken (the IPAM's claims).
func ringEntries(r *ring.Ring) antientropy.Entries {
	return func(yield func(key string, h uint64)) {
		r.EachClaimEntry(func(owner string, entry []byte) { yield(owner, antientropy.Hash(entry)) })
	}
}

// digest returns the digest of every served ring, hashing again only the
// rings that changed since; the owner's lock is held.
func (g *Gossip) digest(sv Served) []ipamwire.RingDigest {
	var out []ipamwire.RingDigest
	sv.Each(false, func(id ID, a *ring.Allocator) {
		h := g.bucketHashes(id, a, 0)
		out = append(out, ipamwire.RingDigest{Overlay: id.Overlay, Family: id.Family, Hash: h.Digest()})
	})
	return out
}

// bucketHashes returns a served ring's bucket hashes, n of them (0: as
// many as its owners call for), those of the default count cached until
// the ring changes; the owner's lock is held. n is a valid count (checked
// when decoded).
func (g *Gossip) bucketHashes(id ID, a *ring.Allocator, n int) antientropy.Buckets {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stateOf(id, a)
	if st.changes != a.RingChanges() || st.buckets == nil {
		r := a.Ring()
		st.buckets, _ = antientropy.BucketHashes(ringEntries(r), antientropy.BucketCount(r.Owners()))
		st.changes = a.RingChanges()
	}
	if n == 0 || n == len(st.buckets) {
		return st.buckets
	}
	h, err := antientropy.BucketHashes(ringEntries(a.Ring()), n)
	if err != nil {
		return nil
	}
	return h
}

// answerDigest returns the bucket hashes of the served rings whose digest
// differs from the digest's (step 2): what to unicast to its sender. A
// ring the digest lacks is not served there, and is left out.
func (g *Gossip) answerDigest(m ipamwire.RingMessage) ipamwire.RingMessage {
	var out ipamwire.RingMessage
	g.rings.Read(func(sv Served) {
		out = ipamwire.RingMessage{ClusterID: sv.ClusterID(), From: g.self}
		theirs := map[ID]uint64{}
		for _, e := range m.Digest {
			theirs[ID{e.Overlay, e.Family}] = e.Hash
		}
		for _, mine := range g.digest(sv) {
			id := ID{mine.Overlay, mine.Family}
			if h, ok := theirs[id]; !ok || h == mine.Hash {
				continue
			}
			hashes := g.bucketHashes(id, sv.Allocator(id), 0)
			out.Buckets = append(out.Buckets, ipamwire.RingBuckets{Overlay: id.Overlay, Family: id.Family, Hashes: hashes.Encode()})
		}
	})
	return out
}

// answerBuckets returns, of every ring of a bucket-hashes message, this
// agent's entries of the buckets that differ, naming them (step 3): the
// push that asks the other for its own entries back.
func (g *Gossip) answerBuckets(m ipamwire.RingMessage) ipamwire.RingMessage {
	var out ipamwire.RingMessage
	g.rings.Read(func(sv Served) {
		out = ipamwire.RingMessage{ClusterID: sv.ClusterID()}
		for _, e := range m.Buckets {
			id := ID{e.Overlay, e.Family}
			a := sv.Allocator(id)
			if a == nil {
				continue
			}
			theirs, err := antientropy.DecodeBuckets(e.Hashes)
			if err != nil {
				continue // checked when decoded
			}
			mine := g.bucketHashes(id, a, len(theirs))
			if push, ok := bucketPush(a.Ring(), mine, theirs); ok {
				push.Overlay, push.Family = e.Overlay, e.Family
				out.Rings = append(out.Rings, push)
			}
		}
	})
	return out
}

// bucketPush is r's entries of the buckets whose hashes (mine, r's) differ
// from theirs, naming them.
func bucketPush(r *ring.Ring, mine, theirs antientropy.Buckets) (ipamwire.RingEntry, bool) {
	differ, err := antientropy.Differ(mine, theirs)
	if err != nil || len(differ) == 0 {
		return ipamwire.RingEntry{}, false
	}
	in, err := antientropy.Selector(len(theirs), differ)
	if err != nil {
		return ipamwire.RingEntry{}, false
	}
	return ipamwire.RingEntry{Ring: r.Select(in).Claims().Encode(), N: len(theirs), Buckets: differ}, true
}

// pushBack returns, of the buckets a peer pushed (and named), this agent's
// entries where they still differ from what it received after the merge
// (step 4): the pusher lacks something.
func (g *Gossip) pushBack(pushed ipamwire.RingMessage) ipamwire.RingMessage {
	var out ipamwire.RingMessage
	g.rings.Read(func(sv Served) {
		out = ipamwire.RingMessage{ClusterID: sv.ClusterID()}
		for _, e := range pushed.Rings {
			if a := sv.Allocator(ID{e.Overlay, e.Family}); a != nil {
				if back, ok := pushBackEntry(a.Ring(), e); ok {
					out.Rings = append(out.Rings, back)
				}
			}
		}
	})
	return out
}

// pushBackEntry is r's entries of the buckets a push named where they
// differ from the pushed ones (r has merged the push).
func pushBackEntry(r *ring.Ring, pushed ipamwire.RingEntry) (ipamwire.RingEntry, bool) {
	if pushed.N == 0 {
		return ipamwire.RingEntry{}, false
	}
	theirs, err := ring.Decode(pushed.Ring)
	if err != nil {
		return ipamwire.RingEntry{}, false
	}
	differ, err := antientropy.StillDiffer(ringEntries(r), ringEntries(theirs), pushed.N, pushed.Buckets)
	if err != nil || len(differ) == 0 {
		return ipamwire.RingEntry{}, false
	}
	in, err := antientropy.Selector(pushed.N, differ)
	if err != nil {
		return ipamwire.RingEntry{}, false
	}
	return ipamwire.RingEntry{Overlay: pushed.Overlay, Family: pushed.Family, Ring: r.Select(in).Claims().Encode()}, true
}
