package ipam

// Ring anti-entropy, for what a broadcast missed (see
// ipamwire.RingMessage): the protocol of package antientropy over each
// served ring's entries (ring.Ring.EachEntry, keyed by owner). It reads the served rings through
// the Service and keeps its caches in each ring's ringGossip.

import (
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/ring"
)

// ringEntries is a ring's claims (its raw tokens) as anti-entropy hashes
// them: each one's canonical encoding, keyed by its owner. Leases are left
// out: every agent seeds them from the masters' records, and a peer's are
// never taken (claims.go).
func ringEntries(r *ring.Ring) antientropy.Entries {
	return func(yield func(key string, h uint64)) {
		r.EachClaimEntry(func(owner string, entry []byte) { yield(owner, antientropy.Hash(entry)) })
	}
}

// ringDigestLocked returns the digest of every served ring, hashing again
// only the rings that changed since; s.mu is held.
func (s *Service) ringDigestLocked() []ipamwire.RingDigest {
	var out []ipamwire.RingDigest
	s.eachServedRing(false, func(k ringID, a *ring.Allocator) {
		h := s.bucketHashesLocked(k, a, 0)
		out = append(out, ipamwire.RingDigest{Overlay: k.overlay, Family: k.family, Hash: h.Digest()})
	})
	return out
}

// bucketHashesLocked returns a served ring's bucket hashes, n of them (0:
// as many as its owners call for), those of the default count cached until
// the ring changes; s.mu is held. n is a valid count (checked when
// decoded).
func (s *Service) bucketHashesLocked(k ringID, a *ring.Allocator, n int) antientropy.Buckets {
	g := s.gossipOf(k, a)
	if g.changes != a.RingChanges() || g.buckets == nil {
		r := a.Ring()
		g.buckets, _ = antientropy.BucketHashes(ringEntries(r), antientropy.BucketCount(r.Owners()))
		g.changes = a.RingChanges()
	}
	if n == 0 || n == len(g.buckets) {
		return g.buckets
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
func (s *Service) answerDigest(m ipamwire.RingMessage) ipamwire.RingMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ipamwire.RingMessage{ClusterID: s.clusterID, From: s.id}
	theirs := map[ringID]uint64{}
	for _, e := range m.Digest {
		theirs[ringID{e.Overlay, e.Family}] = e.Hash
	}
	for _, mine := range s.ringDigestLocked() {
		k := ringID{mine.Overlay, mine.Family}
		if h, ok := theirs[k]; !ok || h == mine.Hash {
			continue
		}
		hashes := s.bucketHashesLocked(k, s.allocatorOf(k.overlay, k.family), 0)
		out.Buckets = append(out.Buckets, ipamwire.RingBuckets{Overlay: k.overlay, Family: k.family, Hashes: hashes.Encode()})
	}
	return out
}

// answerBuckets returns, of every ring of a bucket-hashes message, this
// agent's entries of the buckets that differ, naming them (step 3): the
// push that asks the other for its own entries back.
func (s *Service) answerBuckets(m ipamwire.RingMessage) ipamwire.RingMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ipamwire.RingMessage{ClusterID: s.clusterID}
	for _, e := range m.Buckets {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue
		}
		theirs, err := antientropy.DecodeBuckets(e.Hashes)
		if err != nil {
			continue // checked when decoded
		}
		mine := s.bucketHashesLocked(ringID{e.Overlay, e.Family}, a, len(theirs))
		if push, ok := bucketPush(a.Ring(), mine, theirs); ok {
			push.Overlay, push.Family = e.Overlay, e.Family
			out.Rings = append(out.Rings, push)
		}
	}
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
func (s *Service) pushBack(pushed ipamwire.RingMessage) ipamwire.RingMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ipamwire.RingMessage{ClusterID: s.clusterID}
	for _, e := range pushed.Rings {
		if a := s.allocatorOf(e.Overlay, e.Family); a != nil {
			if back, ok := pushBackEntry(a.Ring(), e); ok {
				out.Rings = append(out.Rings, back)
			}
		}
	}
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
