package ipam

// Ring anti-entropy, for what a broadcast missed (see ringMessage): a
// digest of ring hashes, answered with the bucket hashes of the rings that
// differ, answered with the entries of the buckets that differ, and pushed
// back where the receiver still differs. It reads the served rings through
// the Service and keeps its caches in each ring's ringGossip.

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/carve-net/carve/ring"
)

// Bucket counts of ring anti-entropy.
const (
	// maxRingBuckets bounds the buckets of a message (8 bytes a bucket).
	maxRingBuckets = 4096
	// ringBucketLoad is the number of agents a bucket is sized for.
	ringBucketLoad = 16
	// defaultRingBuckets is the most buckets this agent uses: 2 KiB of
	// hashes, about 20 agents a bucket at 5,000 agents.
	defaultRingBuckets = 256
)

// ringBucketCount is the bucket count this agent uses for a ring naming
// owners agents.
func ringBucketCount(owners int) int {
	n := 1
	for n*ringBucketLoad < owners && n < defaultRingBuckets {
		n *= 2
	}
	return n
}

// ringDigestLocked hashes every served ring, again only for rings that
// changed since; s.mu is held.
func (s *Service) ringDigestLocked() []ringDigest {
	var out []ringDigest
	s.eachServedRing(false, func(k ringID, a *ring.Allocator) {
		g := s.gossipOf(k, a)
		if g.changes != a.RingChanges() || g.changes == 0 {
			g.changes, g.hash, g.buckets = a.RingChanges(), ringHash(a.EncodeRing()), nil
		}
		out = append(out, ringDigest{Overlay: k.overlay, Family: k.family, Hash: g.hash})
	})
	return out
}

// ringHash is a ring's hash in a digest.
func ringHash(encoded []byte) uint64 {
	sum := sha256.Sum256(encoded)
	return binary.BigEndian.Uint64(sum[:8])
}

// bucketHashesLocked returns a served ring's bucket hashes, n of them (0:
// as many as its owners call for), cached until the ring changes; s.mu is
// held and the digest is fresh (ringDigestLocked).
func (s *Service) bucketHashesLocked(k ringID, a *ring.Allocator, n int) []uint64 {
	g := s.gossipOf(k, a)
	if n == 0 {
		if g.buckets != nil && g.changes == a.RingChanges() {
			return g.buckets
		}
		n = ringBucketCount(a.Ring().Owners())
	}
	if g.changes == a.RingChanges() && len(g.buckets) == n {
		return g.buckets
	}
	h, err := a.Ring().BucketHashes(n)
	if err != nil {
		return nil // n was checked when decoded
	}
	if g.changes == a.RingChanges() {
		g.buckets = h
	}
	return h
}

// answerDigest returns the bucket hashes of the served rings whose hash
// differs from the digest's: what to unicast to its sender. A ring the
// digest lacks is not served there, and is left out.
func (s *Service) answerDigest(m ringMessage) ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ringMessage{ClusterID: s.clusterID, From: s.id}
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
		out.Buckets = append(out.Buckets, ringBuckets{Overlay: k.overlay, Family: k.family, Hashes: packHashes(hashes)})
	}
	return out
}

// answerBuckets returns, of every ring of a bucket-hashes message, this
// agent's entries of the buckets that differ, naming them: the push that
// asks the other for its own entries back.
func (s *Service) answerBuckets(m ringMessage) ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ringMessage{ClusterID: s.clusterID}
	s.ringDigestLocked() // the cache
	for _, e := range m.Buckets {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue
		}
		mine := s.bucketHashesLocked(ringID{e.Overlay, e.Family}, a, len(e.Hashes)/8)
		if push, ok := bucketPush(a.Ring(), mine, e); ok {
			out.Rings = append(out.Rings, push)
		}
	}
	return out
}

// bucketPush is r's entries of the buckets whose hashes (mine, r's) differ
// from theirs, naming them.
func bucketPush(r *ring.Ring, mine []uint64, theirs ringBuckets) (ringEntry, bool) {
	n := len(theirs.Hashes) / 8
	if len(mine) != n {
		return ringEntry{}, false
	}
	var differ []int
	for i := range n {
		if mine[i] != binary.BigEndian.Uint64(theirs.Hashes[8*i:]) {
			differ = append(differ, i)
		}
	}
	if len(differ) == 0 {
		return ringEntry{}, false
	}
	part, err := r.InBuckets(n, differ)
	if err != nil {
		return ringEntry{}, false
	}
	return ringEntry{Overlay: theirs.Overlay, Family: theirs.Family, Ring: part.Encode(), N: n, Buckets: differ}, true
}

// pushBack returns, of the buckets a peer pushed (and named), this agent's
// entries where they still differ from what it received after the merge:
// the pusher lacks something.
func (s *Service) pushBack(pushed ringMessage) ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ringMessage{ClusterID: s.clusterID}
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
func pushBackEntry(r *ring.Ring, pushed ringEntry) (ringEntry, bool) {
	if pushed.N == 0 {
		return ringEntry{}, false
	}
	theirs, err := ring.Decode(pushed.Ring)
	if err != nil {
		return ringEntry{}, false
	}
	th, err1 := theirs.BucketHashes(pushed.N)
	mh, err2 := r.BucketHashes(pushed.N)
	if err1 != nil || err2 != nil {
		return ringEntry{}, false
	}
	var differ []int
	for _, b := range pushed.Buckets {
		if th[b] != mh[b] {
			differ = append(differ, b)
		}
	}
	if len(differ) == 0 {
		return ringEntry{}, false
	}
	part, err := r.InBuckets(pushed.N, differ)
	if err != nil {
		return ringEntry{}, false
	}
	return ringEntry{Overlay: pushed.Overlay, Family: pushed.Family, Ring: part.Encode()}, true
}

// packHashes is the wire form of bucket hashes.
func packHashes(h []uint64) []byte {
	out := make([]byte, 0, 8*len(h))
	for _, v := range h {
		out = binary.BigEndian.AppendUint64(out, v)
	}
	return out
}
