package membership

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/carve-net/carve/api"
)

// Anti-entropy of the membership.
//
// Changes travel as deltas: a broadcast carries only the records and
// tombstones that changed, and each receiver relays only what was news to
// it. Peers that missed a broadcast (a partition, a restart, a dropped
// message) catch up by anti-entropy, which never sends the whole
// membership:
//
//  1. Periodically each agent gossips a digest to a few neighbours: its
//     agent ids hashed into n buckets (n a power of two growing with the
//     membership, at most maxDigestBuckets), per bucket the XOR of a hash
//     of each id's record and tombstone. 8 bytes a bucket: 2 KiB at 5,000
//     agents.
//  2. A receiver whose buckets differ unicasts back a summary of its own
//     entries in those buckets only: per agent id, the record version, the
//     tombstone version and the hash.
//  3. The digest's sender compares the summary with its own entries of
//     those buckets: it unicasts the records and tombstones the other lacks
//     or has older, and a want list of the ids the other has newer.
//  4. The other answers a want list with those records and tombstones.
//
// Everything merged from a push is checked as any gossip is (signatures,
// ranges, cluster), so anti-entropy adds no trust. Equal memberships cost
// one digest per round; a difference costs about its own size.

// Bounds of anti-entropy messages (checked when decoded).
const (
	// maxDigestBuckets bounds a digest (8 bytes per bucket).
	maxDigestBuckets = 4096
	// digestBucketLoad is the number of agent ids a bucket is sized for.
	digestBucketLoad = 32
	// defaultDigestBuckets is the most buckets this agent sends.
	defaultDigestBuckets = 256
	// maxSummaryEntries bounds the entries of one summary, and
	// maxWant the ids of one want list; what is beyond is caught up in
	// later rounds.
	maxSummaryEntries = 8192
	maxWant           = 8192
	// maxPushRecords bounds the records and tombstones of one push message.
	maxPushRecords = 256
)

// DigestEntry summarises what a membership holds of one agent id.
type DigestEntry struct {
	ID string `json:"id"`
	// V is the record's version, T the tombstone's; 0 for none.
	V uint64 `json:"v,omitempty"`
	T uint64 `json:"t,omitempty"`
	// H hashes the record and the tombstone, signatures included.
	H uint64 `json:"h"`
}

// DigestSummary answers a digest: the entries of the buckets that differ.
type DigestSummary struct {
	// N is the digest's bucket count, Buckets the buckets that differ.
	N       int           `json:"n"`
	Buckets []int         `json:"buckets"`
	Entries []DigestEntry `json:"entries,omitempty"`
}

// idSum caches the digest entry of one agent id, with the record and
// tombstone it was computed from (to notice changes without hashing).
type idSum struct {
	rec     PeerRecord
	hasRec  bool
	tomb    api.Tombstone
	hasTomb bool
	key     uint64 // hash of the id: its bucket
	entry   DigestEntry
}

func (s *idSum) matches(r PeerRecord, hasRec bool, t api.Tombstone, hasTomb bool) bool {
	return s.hasRec == hasRec && s.hasTomb == hasTomb && s.tomb == t && (!hasRec || s.rec.Equal(&r))
}

// Hash64 hashes its parts, each length-prefixed, with SHA-256 and keeps
// the first 8 bytes: the hash of the digests' buckets and entries. The
// agent ranks its mesh peers with it as well (rendezvous hashing).
func Hash64(parts ...[]byte) uint64 {
	h := sha256.New()
	for _, p := range parts {
		h.Write(binary.AppendUvarint(nil, uint64(len(p))))
		h.Write(p)
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// refreshSumsLocked brings the cached per-id entries up to date with the
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
	m.sumsGen, m.digest, m.digestN = m.gen, nil, 0
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
			s = &idSum{key: Hash64([]byte(id))}
			m.sums[id] = s
		}
		s.rec, s.hasRec, s.tomb, s.hasTomb = r, hasRec, t, hasTomb
		s.entry = DigestEntry{ID: id}
		var rj, tj []byte
		if hasRec {
			s.entry.V = r.Version
			rj, _ = json.Marshal(r)
		}
		if hasTomb {
			s.entry.T = t.Version
			tj, _ = json.Marshal(t)
		}
		s.entry.H = Hash64([]byte(id), rj, tj)
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

// withSums runs f with the cached entries up to date (and m.sumMu held).
func (m *Membership) withSums(f func(sums map[string]*idSum)) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	m.sumMu.Lock()
	defer m.sumMu.Unlock()
	m.refreshSumsLocked()
	f(m.sums)
}

// bucketsLocked is bucketHashes(m.sums, n), cached until the next change
// (m.sumMu held, the sums refreshed): the read-only result is shared.
func (m *Membership) bucketsLocked(n int) []byte {
	if m.digestN != n {
		m.digest, m.digestN = bucketHashes(m.sums, n), n
	}
	return m.digest
}

// digestBuckets is the bucket count this agent uses for a membership of
// size entries: a power of two, about digestBucketLoad ids a bucket.
func digestBuckets(size int) int {
	n := 1
	for n*digestBucketLoad < size && n < defaultDigestBuckets {
		n *= 2
	}
	return n
}

// Digest returns the membership's digest: n buckets (0: chosen from the
// membership's size) of 8 bytes each.
func (m *Membership) Digest(n int) []byte {
	var out []byte
	m.withSums(func(sums map[string]*idSum) {
		if n <= 0 {
			n = digestBuckets(len(sums))
		}
		out = slices.Clone(m.bucketsLocked(n))
	})
	return out
}

func bucketHashes(sums map[string]*idSum, n int) []byte {
	b := make([]uint64, n)
	for _, s := range sums {
		b[s.key&uint64(n-1)] ^= s.entry.H
	}
	out := make([]byte, 0, 8*n)
	for _, v := range b {
		out = binary.BigEndian.AppendUint64(out, v)
	}
	return out
}

// validDigest checks a digest from the network: a power of two of buckets.
func validDigest(d []byte) error {
	n := len(d) / 8
	if len(d)%8 != 0 || n == 0 || n > maxDigestBuckets || n&(n-1) != 0 {
		return fmt.Errorf("digest of %d bytes: want 8 bytes times a power of two up to %d", len(d), maxDigestBuckets)
	}
	return nil
}

// AnswerDigest compares a digest with the membership and returns the
// summary of the buckets that differ (nil when none does). Entries are
// bounded by maxSummaryEntries: the buckets beyond are left to later rounds.
func (m *Membership) AnswerDigest(digest []byte) *DigestSummary {
	if validDigest(digest) != nil {
		return nil
	}
	n := len(digest) / 8
	var sum *DigestSummary
	m.withSums(func(sums map[string]*idSum) {
		mine := m.bucketsLocked(n)
		var differ []int
		for i := range n {
			if binary.BigEndian.Uint64(mine[8*i:]) != binary.BigEndian.Uint64(digest[8*i:]) {
				differ = append(differ, i)
			}
		}
		if len(differ) == 0 {
			return
		}
		by := entriesByBucket(sums, n, differ)
		sum = &DigestSummary{N: n}
		for _, b := range differ {
			if len(sum.Entries)+len(by[b]) > maxSummaryEntries && len(sum.Buckets) > 0 {
				break
			}
			sum.Buckets = append(sum.Buckets, b)
			sum.Entries = append(sum.Entries, by[b]...)
		}
	})
	return sum
}

// entriesByBucket returns the entries of the given buckets, sorted by id.
func entriesByBucket(sums map[string]*idSum, n int, buckets []int) map[int][]DigestEntry {
	want := map[int]bool{}
	for _, b := range buckets {
		want[b] = true
	}
	by := map[int][]DigestEntry{}
	for _, id := range slices.Sorted(maps.Keys(sums)) {
		s := sums[id]
		if b := int(s.key & uint64(n-1)); want[b] {
			by[b] = append(by[b], s.entry)
		}
	}
	return by
}

// AnswerSummary compares another membership's summary with this one: it
// returns what to push to the other (the records and tombstones it lacks
// or has older) and the ids to ask it for (those it has newer). At an equal
// version with a different content both are sent: the merge rule decides.
func (m *Membership) AnswerSummary(s *DigestSummary) (push State, want []string) {
	if s == nil || s.N <= 0 || s.N > maxDigestBuckets || s.N&(s.N-1) != 0 {
		return push, nil
	}
	theirs := map[string]DigestEntry{}
	for _, e := range s.Entries {
		theirs[e.ID] = e
	}
	var pushIDs []string
	m.withSums(func(sums map[string]*idSum) {
		by := entriesByBucket(sums, s.N, s.Buckets)
		mine := map[string]DigestEntry{}
		for _, es := range by {
			for _, e := range es {
				mine[e.ID] = e
			}
		}
		for _, id := range slices.Sorted(maps.Keys(mine)) {
			me, they := mine[id], theirs[id]
			if me.H == they.H {
				continue
			}
			// Sent unless the other has both newer or equal.
			if me.V > they.V || me.T > they.T || (me.V == they.V && me.T == they.T) {
				pushIDs = append(pushIDs, id)
			}
		}
		for _, id := range slices.Sorted(maps.Keys(theirs)) {
			me, they := mine[id], theirs[id]
			if me.H == they.H || api.ValidateAgentID(id) != nil {
				continue
			}
			if they.V > me.V || they.T > me.T || (me.V == they.V && me.T == they.T) {
				want = append(want, id)
			}
		}
	})
	if len(want) > maxWant {
		want = want[:maxWant]
	}
	return m.Lookup(pushIDs), want
}

// Lookup returns the records and tombstones of the given agent ids.
func (m *Membership) Lookup(ids []string) State {
	m.mu.RLock()
	defer m.mu.RUnlock()
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

// AntiEntropyBytes is what one anti-entropy round between two agents sends,
// by message, as the gossip handler exchanges them.
type AntiEntropyBytes struct {
	Digest, Summary, Want, Push int
	// Messages is the number of messages (the digest included).
	Messages int
}

// Total is the bytes of the whole round.
func (b AntiEntropyBytes) Total() int { return b.Digest + b.Summary + b.Want + b.Push }

// AntiEntropyRound runs one anti-entropy round from a (which sends its
// digest) to b, in process, merging what each receives without checks, and
// returns the bytes of every message as the agents encode them. It is the
// handler's exchange without the network: for tests and benches that
// measure message sizes deterministically.
func AntiEntropyRound(clusterID, aID string, a, b *Membership) AntiEntropyBytes {
	var out AntiEntropyBytes
	send := func(msg Message) int {
		out.Messages++
		return len(Encode(msg))
	}
	out.Digest = send(Message{ClusterID: clusterID, From: aID, Digest: a.Digest(0)})
	sum := b.AnswerDigest(a.Digest(0))
	if sum == nil {
		return out
	}
	out.Summary = send(Message{ClusterID: clusterID, Summary: sum})
	push, want := a.AnswerSummary(sum)
	for _, c := range Chunks(push) {
		out.Push += send(Message{ClusterID: clusterID, State: c})
		b.Merge(c)
	}
	if len(want) > 0 {
		out.Want = send(Message{ClusterID: clusterID, Want: want})
		for _, c := range Chunks(b.Lookup(want)) {
			out.Push += send(Message{ClusterID: clusterID, State: c})
			a.Merge(c)
		}
	}
	return out
}

// validateAntiEntropy checks the anti-entropy fields of a message from the
// network.
func validateAntiEntropy(msg *Message) error {
	if msg.Digest != nil {
		if err := validDigest(msg.Digest); err != nil {
			return err
		}
		if err := api.ValidateAgentID(msg.From); err != nil {
			return fmt.Errorf("digest sender: %w", err)
		}
	}
	if s := msg.Summary; s != nil {
		if s.N <= 0 || s.N > maxDigestBuckets || s.N&(s.N-1) != 0 {
			return fmt.Errorf("summary of %d buckets", s.N)
		}
		if len(s.Entries) > maxSummaryEntries || len(s.Buckets) > s.N {
			return fmt.Errorf("summary of %d entries in %d buckets", len(s.Entries), len(s.Buckets))
		}
		for _, b := range s.Buckets {
			if b < 0 || b >= s.N {
				return fmt.Errorf("summary bucket %d of %d", b, s.N)
			}
		}
		for _, e := range s.Entries {
			if err := api.ValidateAgentID(e.ID); err != nil {
				return fmt.Errorf("summary entry: %w", err)
			}
		}
	}
	if len(msg.Want) > maxWant {
		return fmt.Errorf("want list of %d ids", len(msg.Want))
	}
	for _, id := range msg.Want {
		if err := api.ValidateAgentID(id); err != nil {
			return fmt.Errorf("want: %w", err)
		}
	}
	return nil
}
