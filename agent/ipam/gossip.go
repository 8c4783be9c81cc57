package ipam

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// maxRingMessageBytes bounds one ring message (mesh's own limit is 10 MiB).
const maxRingMessageBytes = 8 << 20

// maxClusterIDLen bounds the cluster id of a ring message.
const maxClusterIDLen = 256

// Errors of received ring gossip, for callers that branch.
var (
	// errBadRingMessage marks a ring message that cannot be decoded.
	errBadRingMessage = errors.New("bad ring message")
	// ErrOtherCluster marks a ring message of another masters' cluster: its
	// leases carry Raft indexes of another log and are refused whole.
	ErrOtherCluster = errors.New("ring message of another cluster")
)

// ringEntry is one overlay family's ring, or part of it, in a gossip
// message: any subset of a ring's entries is a valid ring that joins as
// the whole would (ring.Ring.Delta).
type ringEntry struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Ring    []byte `json:"ring"`
	// N and Buckets, when set, say that Ring holds the sender's entries of
	// these buckets (of N) and ask the receiver for its own entries of the
	// buckets where they still differ after the merge.
	N       int   `json:"n,omitempty"`
	Buckets []int `json:"buckets,omitempty"`
}

// ringBuckets is one ring's bucket hashes (ring.Ring.BucketHashes): 8
// bytes a bucket, big-endian, a power of two of buckets.
type ringBuckets struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hashes  []byte `json:"hashes"`
}

// ringMessage is the payload of RingChannel.
//
// Changes travel as deltas: a broadcast carries only the entries of each
// ring that the other agents do not hold yet (what a grant, a return or a
// free-count update wrote), and each receiver relays only what was news to
// it. What the masters' leases change is never broadcast: every agent
// seeds it into its rings from its own view of the masters.
//
// Anti-entropy, for what a broadcast missed, never sends a whole ring:
//
//  1. Periodic gossip carries a digest: a hash of every ring the sender
//     serves.
//  2. A receiver whose ring hashes differently unicasts back that ring's
//     bucket hashes: its entries hashed into n buckets by owner (a power
//     of two, about ringBucketLoad agents a bucket, at most
//     maxRingBuckets).
//  3. The digest's sender unicasts its entries of the buckets that differ,
//     naming them.
//  4. The receiver merges them and, where its entries of those buckets
//     still differ from what it received, unicasts its own back.
//
// Equal rings cost one digest of a few dozen bytes per ring and round; a
// difference costs the bucket hashes and about the size of the buckets
// that differ.
type ringMessage struct {
	// ClusterID is the sender's masters' cluster ("" when it knows none).
	ClusterID string      `json:"cluster_id,omitempty"`
	Rings     []ringEntry `json:"rings,omitempty"`
	// From and Digest: the sender's anti-entropy digest.
	From   string       `json:"from,omitempty"`
	Digest []ringDigest `json:"digest,omitempty"`
	// Buckets answers a digest (by unicast): the bucket hashes of the
	// rings whose digest hash differs.
	Buckets []ringBuckets `json:"buckets,omitempty"`
}

// ringDigest is one ring's entry in a digest.
type ringDigest struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hash    uint64 `json:"hash"`
}

// maxDigestRings bounds the rings of a digest (two families per overlay).
const maxDigestRings = 1024

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

type ringID struct{ overlay, family string }

// ringPersistEvery is how often rings changed by other agents' entries
// only are written to disk.
const ringPersistEvery = 10 * time.Second

// ringGossip is what the gossip of one ring keeps.
type ringGossip struct {
	// known joins what the other agents hold or derive themselves: what
	// this agent announced, what it received, and the masters' leases it
	// seeded. A broadcast sends the ring's delta since known.
	known *ring.Ring
	// announced is the ring's change count at the last announcement.
	announced uint64
	// changes, hash and buckets cache the digest hash and the bucket
	// hashes (of len(buckets) buckets), valid at that change count.
	changes uint64
	hash    uint64
	buckets []uint64
}

// ringBucketCount is the bucket count this agent uses for a ring naming
// owners agents.
func ringBucketCount(owners int) int {
	n := 1
	for n*ringBucketLoad < owners && n < defaultRingBuckets {
		n *= 2
	}
	return n
}

// ringData is a ring message as gossip data.
type ringData struct {
	msg ringMessage
	// sent, when set, counts the bytes of every encoding.
	sent func(kind string, n int)
}

// Encode implements gossip.Data.
func (d ringData) Encode() [][]byte {
	b, err := json.Marshal(d.msg)
	if err != nil {
		return nil
	}
	if d.sent != nil {
		kind := "delta"
		if d.msg.Digest != nil {
			kind = "digest"
		}
		d.sent(kind, len(b))
	}
	return [][]byte{b}
}

// Merge implements gossip.Data as a join: one ring per (overlay, family),
// two rings of one key joined by the ring CRDT's own merge, so that pending
// sends on a slow link never pile up copies. Data of two cluster ids has no
// join: the other (the newer, as mesh merges pending data with new data)
// wins, since the older cluster's rings are worthless to every receiver.
func (d ringData) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(ringData)
	if !ok {
		return d
	}
	if d.msg.ClusterID != "" && o.msg.ClusterID != "" && d.msg.ClusterID != o.msg.ClusterID {
		return o
	}
	out := ringMessage{ClusterID: cmp.Or(o.msg.ClusterID, d.msg.ClusterID), From: o.msg.From, Digest: o.msg.Digest}
	if out.Digest == nil {
		out.From, out.Digest = d.msg.From, d.msg.Digest
	}
	at := map[[2]string]int{}
	for _, e := range slices.Concat(d.msg.Rings, o.msg.Rings) {
		k := [2]string{e.Overlay, e.Family}
		if i, dup := at[k]; dup {
			out.Rings[i].Ring = joinRings(out.Rings[i].Ring, e.Ring)
			continue
		}
		at[k] = len(out.Rings)
		out.Rings = append(out.Rings, e)
	}
	sent := o.sent
	if sent == nil {
		sent = d.sent
	}
	return ringData{msg: out, sent: sent}
}

// joinRings is the CRDT merge of two encoded rings. An encoding that does
// not decode is dropped for the valid one; two valid rings without a join
// (other universes, overlapping leases) keep the newer, b.
func joinRings(a, b []byte) []byte {
	ra, errA := ring.Decode(a)
	rb, errB := ring.Decode(b)
	switch {
	case errA != nil:
		return b
	case errB != nil:
		return a
	}
	if _, err := ra.Merge(rb); err != nil {
		return b
	}
	return ra.Encode()
}

// decodeRingMessage decodes a ring message from the network; each ring is
// validated by ring.Decode when merged.
func decodeRingMessage(b []byte) (ringMessage, error) {
	var m ringMessage
	if len(b) > maxRingMessageBytes {
		return ringMessage{}, fmt.Errorf("%w: %d bytes", errBadRingMessage, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return ringMessage{}, fmt.Errorf("%w: %v", errBadRingMessage, err)
	}
	if len(m.ClusterID) > maxClusterIDLen {
		return ringMessage{}, fmt.Errorf("%w: cluster id of %d bytes", errBadRingMessage, len(m.ClusterID))
	}
	for _, e := range m.Rings {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: ring: %v", errBadRingMessage, err)
		}
	}
	if m.Digest != nil {
		if err := api.ValidateAgentID(m.From); err != nil {
			return ringMessage{}, fmt.Errorf("%w: digest sender: %v", errBadRingMessage, err)
		}
		if len(m.Digest) > maxDigestRings {
			return ringMessage{}, fmt.Errorf("%w: digest of %d rings", errBadRingMessage, len(m.Digest))
		}
	}
	for _, e := range m.Digest {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: digest: %v", errBadRingMessage, err)
		}
	}
	for _, e := range m.Rings {
		if e.N == 0 && e.Buckets == nil {
			continue
		}
		if err := validBucketCount(e.N); err != nil {
			return ringMessage{}, fmt.Errorf("%w: ring %s/%s: %v", errBadRingMessage, e.Overlay, e.Family, err)
		}
		if len(e.Buckets) == 0 || len(e.Buckets) > e.N {
			return ringMessage{}, fmt.Errorf("%w: ring %s/%s: %d buckets of %d", errBadRingMessage, e.Overlay, e.Family, len(e.Buckets), e.N)
		}
		for _, b := range e.Buckets {
			if b < 0 || b >= e.N {
				return ringMessage{}, fmt.Errorf("%w: ring %s/%s: bucket %d of %d", errBadRingMessage, e.Overlay, e.Family, b, e.N)
			}
		}
	}
	if len(m.Buckets) > maxDigestRings {
		return ringMessage{}, fmt.Errorf("%w: bucket hashes of %d rings", errBadRingMessage, len(m.Buckets))
	}
	for _, e := range m.Buckets {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: bucket hashes: %v", errBadRingMessage, err)
		}
		if len(e.Hashes)%8 != 0 {
			return ringMessage{}, fmt.Errorf("%w: bucket hashes of %d bytes: want 8 a bucket", errBadRingMessage, len(e.Hashes))
		}
		if err := validBucketCount(len(e.Hashes) / 8); err != nil {
			return ringMessage{}, fmt.Errorf("%w: bucket hashes: %v", errBadRingMessage, err)
		}
	}
	return m, nil
}

// validBucketCount checks a bucket count from the network.
func validBucketCount(n int) error {
	if n < 1 || n > maxRingBuckets || n&(n-1) != 0 {
		return fmt.Errorf("%d buckets: want a power of two up to %d", n, maxRingBuckets)
	}
	return nil
}

// validRingKey checks the overlay and family that name a ring.
func validRingKey(overlay, family string) error {
	if family != "4" && family != "6" {
		return fmt.Errorf("family %q", family)
	}
	return api.ValidateOverlayName(overlay)
}

// allocatorOf returns a served overlay's allocator of a family ("4", "6");
// the caller holds s.mu.
func (s *Service) allocatorOf(overlay, family string) *ring.Allocator {
	o := s.overlays[overlay]
	if o == nil || o.unserved != "" {
		return nil
	}
	if family == "6" {
		return o.alloc[1]
	}
	return o.alloc[0]
}

// rings returns every ring this agent serves.
func (s *Service) rings() ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := ringMessage{ClusterID: s.clusterID}
	s.eachServedRing(false, func(k ringID, a *ring.Allocator) {
		m.Rings = append(m.Rings, ringEntry{Overlay: k.overlay, Family: k.family, Ring: a.EncodeRing()})
	})
	return m
}

// Rings returns the encoding of every ring this agent serves, by
// "<overlay>/<family>".
func (s *Service) Rings() map[string][]byte {
	out := map[string][]byte{}
	for _, e := range s.rings().Rings {
		out[e.Overlay+"/"+e.Family] = e.Ring
	}
	return out
}

// eachServedRing calls f for every served ring, in order, after writing
// its free counts into it when syncFree is set; s.mu is held. Free counts
// are written only where they are announced at once (announce): a digest
// of counts no broadcast carried yet would start anti-entropy that races
// the broadcast, and a receiver that got the push first would not relay it.
func (s *Service) eachServedRing(syncFree bool, f func(k ringID, a *ring.Allocator)) {
	for _, name := range sortedKeys(s.overlays) {
		for fam := range families {
			a := s.allocatorOf(name, familyName(fam))
			if a == nil {
				continue
			}
			if syncFree {
				if _, err := a.SyncFree(); err != nil {
					s.log.Warn("ring free counts", "overlay", name, "err", err)
				}
			}
			f(ringID{name, familyName(fam)}, a)
		}
	}
}

// gossipOf returns the gossip state of a served ring; s.mu is held.
func (s *Service) gossipOf(k ringID, a *ring.Allocator) *ringGossip {
	g := s.gossipState[k]
	if g == nil {
		g = &ringGossip{}
		s.gossipState[k] = g
	}
	if u := a.Ring().Universe(); g.known == nil || g.known.Universe() != u {
		g.known, _ = ring.NewRing(u) // the allocator's universe: valid
		g.changes, g.buckets = 0, nil
	}
	return g
}

// markKnown applies to an overlay family's known ring what every agent
// derives alike (the masters' leases), or what it already holds (a ring
// read back from disk), so that it is never broadcast; s.mu is held.
func (s *Service) markKnown(o *overlay, fam int, f func(known *ring.Ring) error) {
	a := o.alloc[fam]
	if a == nil {
		return
	}
	if g := s.gossipOf(ringID{o.name, familyName(fam)}, a); g.known != nil {
		if err := f(g.known); err != nil {
			s.log.Debug("known ring", "overlay", o.name, "family", familyName(fam), "err", err)
		}
	}
}

// forgetGossip drops the gossip state of an overlay's rings (retired: its
// next rings start over); s.mu is held.
func (s *Service) forgetGossip(overlay string) {
	for fam := range families {
		delete(s.gossipState, ringID{overlay, familyName(fam)})
	}
}

// announce broadcasts, of every served ring, the entries the other agents
// do not hold yet: what this agent wrote since its last announcement (a
// grant, a return, free counts). Nothing, when nothing changed.
func (s *Service) announce() {
	s.mu.Lock()
	m := ringMessage{ClusterID: s.clusterID}
	s.eachServedRing(true, func(k ringID, a *ring.Allocator) {
		g := s.gossipOf(k, a)
		if g.announced == a.RingChanges() {
			return
		}
		g.announced = a.RingChanges()
		if d, ok := a.Ring().Delta(g.known); ok {
			m.Rings = append(m.Rings, ringEntry{Overlay: k.overlay, Family: k.family, Ring: d.Encode()})
			if _, err := g.known.Merge(d); err != nil {
				s.log.Debug("known ring", "overlay", k.overlay, "family", k.family, "err", err)
			}
		}
	})
	s.mu.Unlock()
	s.broadcast(m)
}

// kickAnnounce asks Run to announce (from gossip callbacks, which must not
// broadcast themselves).
func (s *Service) kickAnnounce() {
	select {
	case s.announceKick <- struct{}{}:
	default:
	}
}

// mergeRings merges remote rings (or parts), makes the changed ones
// durable, and returns what was news (to relay): the deltas of the changed
// rings. A remote change that would take a range holding allocations is
// refused by the allocator (ring.TakeoverError) and the ring stays as it
// was; so does a message of another cluster (ErrOtherCluster).
func (s *Service) mergeRings(m ringMessage) (ringMessage, error) {
	news, b, err := s.decideMerge(m)
	if b != nil {
		if ferr := s.flush(b); ferr != nil {
			err = errors.Join(err, fmt.Errorf("persist rings: %w", ferr))
		}
	}
	if len(news.Rings) > 0 {
		s.changed()
	}
	return news, err
}

// persistDirtyRings writes the rings that changed by other agents'
// entries only since they were last written (Run, every ringPersistEvery).
func (s *Service) persistDirtyRings() {
	s.mu.Lock()
	var b *batch
	for _, k := range slices.SortedFunc(maps.Keys(s.dirtyRings), func(x, y ringID) int {
		return cmp.Or(cmp.Compare(x.overlay, y.overlay), cmp.Compare(x.family, y.family))
	}) {
		delete(s.dirtyRings, k)
		if a := s.allocatorOf(k.overlay, k.family); a != nil {
			b = s.enqueue(change{writes: []write{putRing(k.overlay, familyIndex(k.family), a.EncodeRing())}})
		}
	}
	s.mu.Unlock()
	if b != nil {
		if err := s.flush(b); err != nil {
			s.log.Warn("persist rings", "err", err)
		}
	}
}

func (s *Service) decideMerge(m ringMessage) (ringMessage, *batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	news := ringMessage{ClusterID: s.clusterID}
	if s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID {
		return news, nil, fmt.Errorf("%w: %q, this agent's is %q", ErrOtherCluster, m.ClusterID, s.clusterID)
	}
	var b *batch
	var errs []error
	for _, e := range m.Rings {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue // an overlay this agent does not serve (yet)
		}
		remote, err := ring.Decode(e.Ring)
		if err != nil {
			errs = append(errs, fmt.Errorf("ring %s/%s: %w", e.Overlay, e.Family, err))
			continue
		}
		before, ownedBefore := a.Ring(), a.Owned()
		changed, err := a.Merge(remote)
		if err != nil {
			var te *ring.TakeoverError
			if errors.As(err, &te) {
				s.log.Warn("refused a ring change that takes addresses in use", "overlay", e.Overlay, "family", e.Family, "err", err)
			}
			errs = append(errs, fmt.Errorf("ring %s/%s: %w", e.Overlay, e.Family, err))
			continue
		}
		g := s.gossipOf(ringID{e.Overlay, e.Family}, a)
		if _, err := g.known.Merge(remote); err != nil {
			s.log.Debug("known ring", "overlay", e.Overlay, "family", e.Family, "err", err)
		}
		if !changed {
			continue
		}
		fam := familyIndex(e.Family)
		o := s.overlays[e.Overlay]
		writes, adopted := s.syncBlocks(o, fam)
		k := ringID{e.Overlay, e.Family}
		if len(writes) > 0 || adopted || !slices.Equal(ownedBefore, a.Owned()) {
			// What this agent owns moved: durable before anything is
			// allocated from it.
			delete(s.dirtyRings, k)
			b = s.enqueue(change{writes: append([]write{putRing(e.Overlay, fam, a.EncodeRing())}, writes...)})
		} else {
			// Other agents' entries only (free counts, their grants): a
			// crash loses nothing anti-entropy does not bring back, and
			// writing the whole ring per change would cost every agent
			// the cluster's size on disk for each change anywhere.
			s.dirtyRings[k] = true
		}
		if adopted {
			// A grant, or one this agent held before it lost its data dir:
			// take back the addresses its containers hold there first.
			s.claimPersisted(o, slog.LevelDebug)
			s.reclaimFromCNICache(o, func(c change) { b = s.enqueue(c) })
		}
		if d, ok := a.Ring().Delta(before); ok {
			news.Rings = append(news.Rings, ringEntry{Overlay: e.Overlay, Family: e.Family, Ring: d.Encode()})
		}
	}
	return news, b, errors.Join(errs...)
}

// broadcast sends changed rings on the ring channel.
func (s *Service) broadcast(m ringMessage) {
	if len(m.Rings) == 0 {
		return
	}
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch != nil {
		ch.Broadcast(ringData{msg: m, sent: s.onSent})
	}
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

// unicast sends a ring message to one peer.
func (s *Service) unicast(dst, kind string, m ringMessage) {
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch == nil {
		return
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	if err := ch.Unicast(dst, b); err != nil {
		s.log.Debug("ring anti-entropy unicast", "to", dst, "err", err)
		return
	}
	if s.onSent != nil {
		s.onSent(kind, len(b))
	}
}

// RingGossip is the handler of RingChannel.
func (s *Service) RingGossip() gossip.Handler { return (*ringHandler)(s) }

// ringHandler receives ring gossip.
type ringHandler Service

// Gossip implements gossip.Handler: the digest of the served rings. It
// also has Run announce what this agent wrote since its last announcement
// (free counts are written into the rings then, not on every allocation).
func (h *ringHandler) Gossip() gossip.Data {
	s := (*Service)(h)
	s.mu.Lock()
	d := s.ringDigestLocked()
	cluster := s.clusterID // sync changes it
	s.mu.Unlock()
	s.kickAnnounce()
	if len(d) == 0 {
		return nil
	}
	return ringData{msg: ringMessage{ClusterID: cluster, From: s.id, Digest: d}, sent: s.onSent}
}

// receive handles a ring message; src is the sender of a unicast ("" for
// broadcast and gossip).
func (h *ringHandler) receive(src string, msg []byte) (gossip.Data, error) {
	s := (*Service)(h)
	m, err := decodeRingMessage(msg)
	if err != nil {
		s.metrics.ringGossip.WithLabelValues(gossipBad).Inc()
		return nil, err
	}
	s.mu.Lock()
	other := s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID
	s.mu.Unlock()
	if other {
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
		return nil, fmt.Errorf("%w: %q", ErrOtherCluster, m.ClusterID)
	}
	if m.Digest != nil && m.From != s.id {
		if ans := s.answerDigest(m); len(ans.Buckets) > 0 {
			s.unicast(m.From, "buckets", ans)
		}
	}
	if len(m.Buckets) > 0 && src != "" {
		if push := s.answerBuckets(m); len(push.Rings) > 0 {
			s.unicast(src, "push", push)
		}
	}
	if len(m.Rings) == 0 {
		return nil, nil
	}
	news, err := s.mergeRings(m)
	switch {
	case errors.Is(err, ErrOtherCluster):
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
	case err != nil:
		s.metrics.ringGossip.WithLabelValues(gossipRefused).Inc()
	}
	if src != "" && err == nil {
		if back := s.pushBack(m); len(back.Rings) > 0 {
			s.unicast(src, "push", back)
		}
	}
	if len(news.Rings) == 0 {
		if err == nil {
			s.metrics.ringGossip.WithLabelValues(gossipKnown).Inc()
		}
		return nil, err
	}
	s.metrics.ringGossip.WithLabelValues(gossipNews).Inc()
	if src != "" {
		return nil, err // merged, not relayed: each agent runs its own anti-entropy
	}
	return ringData{msg: news, sent: s.onSent}, err
}

// OnGossip implements gossip.Handler.
func (h *ringHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive("", msg) }

// OnBroadcast implements gossip.Handler.
func (h *ringHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return h.receive("", msg)
}

// OnUnicast implements gossip.Handler. Two kinds of message travel by
// unicast on the ring channel: space requests and their answers (growth,
// spacemsg.go), which always carry a "kind", and anti-entropy messages
// (bucket hashes, pushes), which never do (merged and not relayed).
func (h *ringHandler) OnUnicast(src string, msg []byte) error {
	if isSpaceMessage(msg) {
		return h.onSpaceMessage(src, msg)
	}
	_, err := h.receive(src, msg)
	return err
}

// isSpaceMessage tells a space message from a ring message by its
// top-level "kind" key; the decoders check everything else.
func isSpaceMessage(msg []byte) bool {
	if len(msg) > maxRingMessageBytes {
		return false
	}
	var probe struct {
		Kind *string `json:"kind"`
	}
	return json.Unmarshal(msg, &probe) == nil && probe.Kind != nil
}
