package membership

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/api"
)

// Anti-entropy of the membership.
//
// Changes travel as deltas: a broadcast carries only the records and
// tombstones that changed, and each receiver relays only what was news to
// it. Peers that missed a broadcast (a partition, a restart, a dropped
// message) catch up by anti-entropy, which never sends the whole
// membership. It is package antientropy's protocol over the membership's
// entries: one per agent id, keyed by the id, hashing the id's record and
// tombstone (signatures included):
//
//  1. Periodically each agent gossips its digest to a few neighbours (8
//     bytes).
//  2. A receiver whose digest differs unicasts back its bucket hashes (8
//     bytes a bucket: 2 KiB at 5,000 agents).
//  3. The digest's sender unicasts its records and tombstones of the
//     buckets that differ, in messages of at most maxPushRecords, each
//     naming the buckets it holds whole.
//  4. The receiver merges them and, where its entries of those buckets
//     still differ from what it received, unicasts its own back.
//
// Everything merged from a push is checked as any gossip is (signatures,
// ranges, cluster), so anti-entropy adds no trust. Equal memberships cost
// one digest per round; a difference costs the bucket hashes and about the
// size of the buckets that differ.

// maxPushRecords bounds the records and tombstones of one push message.
const maxPushRecords = 256

// AntiEntropy is the anti-entropy part of a message (see above): at most
// one of a digest (periodic gossip), bucket hashes (the unicast answer to
// a digest) and the buckets a push holds (with the message's records and
// tombstones, by unicast).
type AntiEntropy struct {
	// Digest is the sender's digest (step 1); the message's From names
	// the sender.
	Digest *uint64 `json:"digest,omitempty"`
	// Buckets are the sender's bucket hashes (step 2,
	// antientropy.Buckets.Encode).
	Buckets []byte `json:"buckets,omitempty"`
	// N and Push name the buckets (of N) whose records and tombstones the
	// message holds whole (step 3): the receiver pushes back its own of
	// those where they still differ.
	N    int   `json:"n,omitempty"`
	Push []int `json:"push,omitempty"`
}

// Push is one push message's content: records and tombstones, and the
// buckets (of N) it holds whole (none: a push back, or a bucket too large
// for one message).
type Push struct {
	State
	N       int
	Buckets []int
}

// idSum caches the entry hash of one agent id, with the record and
// tombstone it was computed from (to notice changes without hashing).
type idSum struct {
	rec     PeerRecord
	hasRec  bool
	tomb    api.Tombstone
	hasTomb bool
	h       uint64
}

func (s *idSum) matches(r PeerRecord, hasRec bool, t api.Tombstone, hasTomb bool) bool {
	return s.hasRec == hasRec && s.hasTomb == hasTomb && s.tomb == t && (!hasRec || s.rec.Equal(&r))
}

// entryHash is the anti-entropy hash of an agent id's entry: its record
// and tombstone (nil for none), each length-prefixed in their wire form.
func entryHash(id string, r *PeerRecord, t *api.Tombstone) uint64 {
	var rj, tj []byte
	if r != nil {
		rj, _ = json.Marshal(r)
	}
	if t != nil {
		tj, _ = json.Marshal(t)
	}
	b := make([]byte, 0, len(id)+len(rj)+len(tj)+12)
	for _, p := range [][]byte{[]byte(id), rj, tj} {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return antientropy.Hash(b)
}

// Hash64 hashes its parts, each length-prefixed, with SHA-256 and keeps
// the first 8 bytes: the agent ranks its mesh peers with it (rendezvous
// hashing), the same on every peer.
func Hash64(parts ...[]byte) uint64 {
	h := sha256.New()
	for _, p := range parts {
		h.Write(binary.AppendUvarint(nil, uint64(len(p))))
		h.Write(p)
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// refreshSumsLocked brings the cached per-id hashes up to date with the
// records and tombstones, whatever changed them (merges, resets, the
// compaction of tombstones): an entry is hashed again only when its record
// or tombstone differs from the one it was computed from. Nothing is done
// while nothing changed (m.gen): an idle agent's periodic digests would
// otherwise compare every record each time. m.mu is held (read) and
// m.sumMu locked.
func (m *Membership) refreshSumsLocked() {
	if m.sums != nil && m.sumsGen == m.gen {
		return
	}
	m.sumsGen, m.buckets = m.gen, nil
	if m.sums == nil {
		m.sums = map[string]*idSum{}
	}
	update := func(id string) {
		r, hasRec := m.records[id]
		t, hasTomb := m.tombstones[id]
		s := m.sums[id]
		if s != nil && s.matches(r, hasRec, t, hasTomb) {
			return
		}
		if s == nil {
			s = &idSum{}
			m.sums[id] = s
		}
		s.rec, s.hasRec, s.tomb, s.hasTomb = r, hasRec, t, hasTomb
		rp, tp := &r, &t
		if !hasRec {
			rp = nil
		}
		if !hasTomb {
			tp = nil
		}
		s.h = entryHash(id, rp, tp)
	}
	for id := range m.records {
		update(id)
	}
	for id := range m.tombstones {
		if _, ok := m.records[id]; !ok {
			update(id)
		}
	}
	// Every time: counting cannot tell when an id went, since an id with
	// both a record and a tombstone has one entry (a record dropped
	// beside such an id left its entry in every digest, which then never
	// matched a peer's).
	for id := range m.sums {
		_, r := m.records[id]
		_, t := m.tombstones[id]
		if !r && !t {
			delete(m.sums, id)
		}
	}
}

// sumEntries is the cached entries as anti-entropy reads them.
func sumEntries(sums map[string]*idSum) antientropy.Entries {
	return func(yield func(string, uint64)) {
		for id, s := range sums {
			yield(id, s.h)
		}
	}
}

// withSums runs f with the cached entries up to date (and m.sumMu held).
func (m *Membership) withSums(f func(sums map[string]*idSum)) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	m.sumMu.Lock()
	defer m.sumMu.Unlock()
	m.refreshSumsLocked()
	f(m.sums)
}

// bucketsLocked returns the bucket hashes at n buckets (0: the count the
// membership's size calls for); those at that count are cached until the
// next change (m.sumMu held, the sums refreshed) and shared read-only.
func (m *Membership) bucketsLocked(n int) antientropy.Buckets {
	if m.buckets == nil {
		m.buckets, _ = antientropy.BucketHashes(sumEntries(m.sums), antientropy.BucketCount(len(m.sums)))
	}
	if n == 0 || n == len(m.buckets) {
		return m.buckets
	}
	b, err := antientropy.BucketHashes(sumEntries(m.sums), n)
	if err != nil {
		return nil
	}
	return b
}

// Digest returns the membership's digest (step 1): cached, an idle round
// hashes nothing.
func (m *Membership) Digest() uint64 {
	var d uint64
	m.withSums(func(map[string]*idSum) { d = m.bucketsLocked(0).Digest() })
	return d
}

// Buckets returns the membership's bucket hashes at n buckets (0: the
// count its size calls for; else a valid count).
func (m *Membership) Buckets(n int) antientropy.Buckets {
	var out antientropy.Buckets
	m.withSums(func(map[string]*idSum) { out = slices.Clone(m.bucketsLocked(n)) })
	return out
}

// AnswerDigest returns the bucket hashes to answer a peer's digest with
// (step 2), nil when the digest is this membership's.
func (m *Membership) AnswerDigest(digest uint64) antientropy.Buckets {
	var out antientropy.Buckets
	m.withSums(func(map[string]*idSum) {
		if b := m.bucketsLocked(0); b.Digest() != digest {
			out = slices.Clone(b)
		}
	})
	return out
}

// AnswerBuckets returns the pushes that answer a peer's bucket hashes
// (step 3): this membership's records and tombstones of the buckets that
// differ, in messages of at most maxPushRecords, each naming the buckets
// it holds whole; a bucket larger than one message is pushed unnamed (the
// peer's own rounds repair what it holds newer there).
func (m *Membership) AnswerBuckets(theirs antientropy.Buckets) []Push {
	var differ []int
	m.withSums(func(map[string]*idSum) {
		differ, _ = antientropy.Differ(m.bucketsLocked(len(theirs)), theirs)
	})
	if len(differ) == 0 {
		return nil
	}
	return m.pushes(len(theirs), differ, true)
}

// PushBack returns, of the buckets (of n) a push held whole, this
// membership's records and tombstones where its entries, after merging
// the push, still differ from the pushed ones (step 4), in messages of
// at most maxPushRecords, naming nothing (there is no push back of a push
// back).
func (m *Membership) PushBack(pushed State, n int, buckets []int) []Push {
	theirs := pushedEntries(pushed)
	var differ []int
	m.withSums(func(sums map[string]*idSum) {
		differ, _ = antientropy.StillDiffer(sumEntries(sums), theirs, n, buckets)
	})
	if len(differ) == 0 {
		return nil
	}
	return m.pushes(n, differ, false)
}

// pushedEntries is the entries of a pushed state, hashed as the
// membership hashes its own.
func pushedEntries(st State) antientropy.Entries {
	recs := map[string]*PeerRecord{}
	tombs := map[string]*api.Tombstone{}
	for i := range st.Records {
		recs[st.Records[i].ID] = &st.Records[i]
	}
	for i := range st.Tombstones {
		tombs[st.Tombstones[i].AgentID] = &st.Tombstones[i]
	}
	return func(yield func(string, uint64)) {
		for id, r := range recs {
			yield(id, entryHash(id, r, tombs[id]))
		}
		for id, t := range tombs {
			if recs[id] == nil {
				yield(id, entryHash(id, nil, t))
			}
		}
	}
}

// pushes is the records and tombstones of the given buckets (of n), by
// bucket, in messages of at most maxPushRecords; name says whether each
// names the buckets it holds whole.
func (m *Membership) pushes(n int, buckets []int, name bool) []Push {
	in, err := antientropy.Selector(n, buckets)
	if err != nil {
		return nil
	}
	byBucket := map[int][]string{}
	m.mu.RLock()
	defer m.mu.RUnlock()
	ids := slices.Collect(maps.Keys(m.records))
	for id := range m.tombstones {
		if _, ok := m.records[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		if in(id) {
			b := antientropy.BucketOf(id, n)
			byBucket[b] = append(byBucket[b], id)
		}
	}
	var out []Push
	cur := Push{N: n}
	size := func(p Push) int { return len(p.Records) + len(p.Tombstones) }
	flush := func() {
		if size(cur) > 0 {
			if !name || len(cur.Buckets) == 0 {
				cur.N, cur.Buckets = 0, nil
			}
			out = append(out, cur)
		}
		cur = Push{N: n}
	}
	for _, b := range buckets {
		st := m.lookupLocked(byBucket[b])
		k := len(st.Records) + len(st.Tombstones)
		if k == 0 {
			// The peer holds entries here that this one lacks: an
			// empty bucket, named, asks for them back.
			cur.Buckets = append(cur.Buckets, b)
			continue
		}
		if size(cur)+k > maxPushRecords {
			flush()
		}
		if k > maxPushRecords {
			for _, c := range Chunks(st) {
				out = append(out, Push{State: c})
			}
			continue
		}
		cur.Records = append(cur.Records, st.Records...)
		cur.Tombstones = append(cur.Tombstones, st.Tombstones...)
		cur.Buckets = append(cur.Buckets, b)
	}
	if size(cur) == 0 && len(cur.Buckets) > 0 && name {
		out = append(out, cur) // empty buckets alone: named, nothing pushed
		return out
	}
	flush()
	return out
}

// lookupLocked returns the records and tombstones of the given agent ids;
// m.mu is held.
func (m *Membership) lookupLocked(ids []string) State {
	var st State
	for _, id := range ids {
		if r, ok := m.records[id]; ok {
			st.Records = append(st.Records, r)
		}
		if t, ok := m.tombstones[id]; ok {
			st.Tombstones = append(st.Tombstones, t)
		}
	}
	return st
}

// Lookup returns the records and tombstones of the given agent ids.
func (m *Membership) Lookup(ids []string) State {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.lookupLocked(ids)
}

// Chunks splits a state into states of at most maxPushRecords records and
// tombstones, so that no push message grows with the cluster.
func Chunks(st State) []State {
	var out []State
	for len(st.Records)+len(st.Tombstones) > 0 {
		var c State
		nt := min(len(st.Tombstones), maxPushRecords)
		c.Tombstones, st.Tombstones = st.Tombstones[:nt], st.Tombstones[nt:]
		nr := min(len(st.Records), maxPushRecords-nt)
		c.Records, st.Records = st.Records[:nr], st.Records[nr:]
		out = append(out, c)
	}
	return out
}

// Encode is the wire form of a membership message (nil if it cannot be encoded).
func Encode(msg Message) []byte {
	b, err := json.Marshal(msg)
	if err != nil {
		return nil
	}
	return b
}

// validateAntiEntropy checks the anti-entropy part of a message from the
// network.
func validateAntiEntropy(msg *Message) error {
	ae := msg.AE
	if ae == nil {
		return nil
	}
	if ae.Digest != nil {
		if err := api.ValidateAgentID(msg.From); err != nil {
			return fmt.Errorf("digest sender: %w", err)
		}
	}
	if ae.Buckets != nil {
		if _, err := antientropy.DecodeBuckets(ae.Buckets); err != nil {
			return err
		}
	}
	if ae.N != 0 || ae.Push != nil {
		if len(ae.Push) == 0 {
			return fmt.Errorf("a push naming no bucket of %d", ae.N)
		}
		if err := antientropy.ValidBuckets(ae.N, ae.Push); err != nil {
			return err
		}
	}
	return nil
}
