package state

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/snapshot"
)

// DigestEvery is how often, in Raft indexes, the table records a digest of
// its whole replicated state: at the first command it applies in every
// stretch of DigestEvery indexes. Every replica that applied the same log
// records its digests at the same indexes, so masters compare them there
// (GET /cluster/status, carve cluster status, carve_master_state_digest):
// replicas that hold different states at the same index show it within one
// stretch, whatever made them differ (a log applied that the cluster never
// committed, a state machine that read more than its command and state).
const DigestEvery = 1024

// digestsKept is how many recent digests a table keeps to compare.
const digestsKept = 16

// digestBook is the table's recent digests and what makes the next one
// cheap; the caller holds t.mu.
type digestBook struct {
	recent []api.StateDigest // oldest first
	// records caches the hash of each record (records are immutable once
	// stored, so a pointer names one content for good).
	records map[*agentRecord][sha256.Size]byte
}

// recordDigestIfDue records a digest when index enters a stretch of
// DigestEvery that the table's previous index was not in; the caller holds
// t.mu for writing.
func (t *LeaseTable) recordDigestIfDue(prev, index uint64) {
	if index/DigestEvery == prev/DigestEvery && prev != 0 {
		return
	}
	d := api.StateDigest{Index: index, Digest: t.stateDigest()}
	t.digests.recent = append(t.digests.recent, d)
	if n := len(t.digests.recent); n > digestsKept {
		t.digests.recent = slices.Clone(t.digests.recent[n-digestsKept:])
	}
}

// StateDigests returns the table's recent digests, oldest first.
func (t *LeaseTable) StateDigests() []api.StateDigest {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Clone(t.digests.recent)
}

// StateDigest returns the digest of the table's replicated state now, and
// the index it was applied to (for tests and the determinism check).
func (t *LeaseTable) StateDigest() (uint64, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.index, t.stateDigest()
}

// stateDigest hashes everything the log replicates: what the API serves
// and what decides the outcome of later commands (records, tombstones,
// configuration, quarantine, reports, the compaction's horizon, the deny
// list, the last restore, the remembered requests). Allocator structures
// are not hashed: they are rebuilt from the records, and a difference in
// them shows in the records of the next allocation. The caller holds t.mu
// for writing (the record cache).
func (t *LeaseTable) stateDigest() string {
	h := sha256.New()
	num := func(v uint64) { _ = binary.Write(h, binary.BigEndian, v) }
	str := func(s string) { num(uint64(len(s))); h.Write([]byte(s)) }
	js := func(v any) {
		b, err := json.Marshal(v) // maps marshal with sorted keys
		if err != nil {
			b = []byte("unencodable: " + err.Error())
		}
		num(uint64(len(b)))
		h.Write(b)
	}
	str("carve state digest v1")
	num(t.stateIndex)
	str(t.clusterID)
	if t.net != nil {
		js(t.net.Config())
	} else {
		str("")
	}
	if t.digests.records == nil {
		t.digests.records = map[*agentRecord][sha256.Size]byte{}
	}
	live := make(map[*agentRecord][sha256.Size]byte, len(t.agents))
	ids := slices.Sorted(maps.Keys(t.agents))
	num(uint64(len(ids)))
	for _, id := range ids {
		rec := t.agents[id]
		sum, ok := t.digests.records[rec]
		if !ok {
			b, err := json.Marshal(snapshot.AgentOf(rec))
			if err != nil {
				b = []byte("unencodable: " + err.Error())
			}
			sum = sha256.Sum256(b)
		}
		live[rec] = sum
		str(id)
		h.Write(sum[:])
	}
	t.digests.records = live
	js(t.tombstones)
	js(t.servers)
	js(t.quarantine)
	js(t.reports)
	num(t.horizon)
	js(t.marks)
	h.Write(t.denied.Field())
	// usedStatements are left out: masters of the previous release apply
	// grant reports without keeping them, so after a rolling upgrade the
	// replicas may differ there, for the grants reported during it, until
	// those statements expire; only the refusal of a replay depends on it.
	js(t.restore)
	h.Write(t.requests.sum[:])
	return hex.EncodeToString(h.Sum(nil))
}
