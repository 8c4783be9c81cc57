// Package membership is what an agent knows of the other agents: their
// records as the masters signed them, and the tombstones of deleted ones,
// merged from the masters' state and from gossip by one join (Membership);
// the membership gossip messages, their decoding and the anti-entropy that
// repairs what a peer missed; the masters' compaction horizon; and the
// checks a record passes before it is merged (Trust). It neither talks to
// the masters nor programs the kernel: the agent does, with what it holds.
package membership

import (
	"encoding/json"
	"maps"
	"slices"
	"sync"

	"github.com/carve-net/carve/antientropy"

	"github.com/carve-net/carve/api"
)

// State is the whole membership: records and tombstones, with
// the masters' signatures. It is the gossip payload and what is persisted.
type State struct {
	Records    []PeerRecord    `json:"records,omitempty"`
	Tombstones []api.Tombstone `json:"tombstones,omitempty"`
}

// Membership is the set of agents this agent knows, merged from the masters'
// state and from gossip by one rule: per agent id, the highest version wins,
// and a tombstone wins over records of lower or equal version. That rule is
// a join (commutative, associative, idempotent), so gossip order and
// duplicates do not matter, and a late, older record never resurrects a
// deleted agent.
//
// Two records of one agent at the same version with different content are
// both legitimate when the masters signed both: a change of the network
// configuration re-renders records without a new version. The masters'
// copy wins: a record merged from the masters' state replaces one of equal
// version, and gossip never replaces it at that version. Between two
// copies from gossip, the one with the greater JSON encoding wins, so that
// every agent makes the same choice whatever the order.
type Membership struct {
	mu         sync.RWMutex
	records    map[string]PeerRecord
	tombstones map[string]api.Tombstone
	// fromMasters holds the agents whose record is the masters' copy.
	fromMasters map[string]bool
	// horizon is the masters' compaction horizon (horizon.go).
	horizon uint64
	// gen counts the changes of records and tombstones (bumped under mu
	// wherever they change): the anti-entropy caches below are of one gen.
	gen uint64

	// sums caches the anti-entropy hash of every agent id's entry (see
	// antientropy.go), under sumMu, refreshed from the maps above when gen
	// moved past sumsGen; buckets caches their bucket hashes at the count
	// the membership's size calls for (nil: none yet).
	sumMu   sync.Mutex
	sums    map[string]*idSum
	sumsGen uint64
	buckets antientropy.Buckets
}

// New returns an empty membership.
func New() *Membership {
	return &Membership{records: map[string]PeerRecord{}, tombstones: map[string]api.Tombstone{}, fromMasters: map[string]bool{}}
}

// Merge merges a state heard from gossip and returns the part of it that
// was news (empty when nothing changed).
func (m *Membership) Merge(st State) State { return m.merge(st, false) }

// MergeFromMasters merges records and tombstones of the masters' state:
// as Merge, except that at an equal version the masters' copy of a record
// replaces any other.
func (m *Membership) MergeFromMasters(st State) State { return m.merge(st, true) }

func (m *Membership) merge(st State, masters bool) State {
	m.mu.Lock()
	defer m.mu.Unlock()
	var news State
	for _, t := range st.Tombstones {
		if m.mergeTombstone(t) {
			news.Tombstones = append(news.Tombstones, t)
		}
	}
	for _, r := range st.Records {
		if m.mergeRecord(r, masters) {
			news.Records = append(news.Records, r)
		}
	}
	return news
}

func (m *Membership) mergeRecord(r PeerRecord, masters bool) bool {
	if !masters && m.compacted(r.ID, r.Version) {
		return false
	}
	if t, ok := m.tombstones[r.ID]; ok && t.Version >= r.Version {
		return false
	}
	if cur, ok := m.records[r.ID]; ok {
		switch {
		case cur.Version > r.Version:
			return false
		case cur.Version == r.Version && cur.Equal(&r):
			if masters {
				m.fromMasters[r.ID] = true
			}
			return false
		case cur.Version == r.Version && !masters && (m.fromMasters[r.ID] || !recordLess(&cur, &r)):
			return false
		}
	}
	r.Overlays = slices.Clone(r.Overlays)
	m.records[r.ID] = r
	m.gen++
	if masters {
		m.fromMasters[r.ID] = true
	} else {
		delete(m.fromMasters, r.ID)
	}
	return true
}

// recordLess orders two records of the same version deterministically.
func recordLess(a, b *PeerRecord) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) < string(jb)
}

func (m *Membership) mergeTombstone(t api.Tombstone) bool {
	// Equal versions: the masters sign a tombstone alike every time, so
	// two different signatures come from two keys, of which one at most
	// verifies; the comparison only keeps the merge a join.
	if t.Version <= m.horizon {
		return false // compacted (horizon.go)
	}
	if cur, ok := m.tombstones[t.AgentID]; ok && (cur.Version > t.Version || (cur.Version == t.Version && cur.Signature >= t.Signature)) {
		return false
	}
	m.tombstones[t.AgentID] = t
	m.gen++
	if r, ok := m.records[t.AgentID]; ok && r.Version <= t.Version {
		delete(m.records, t.AgentID)
		delete(m.fromMasters, t.AgentID)
	}
	return true
}

// Holds tells whether the membership has exactly this record (same
// version, content and signature): merging it changes nothing, and it was
// checked when it first came.
func (m *Membership) Holds(r *PeerRecord) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	cur, ok := m.records[r.ID]
	return ok && cur.Equal(r)
}

// holdsTombstone is Holds for a tombstone.
func (m *Membership) holdsTombstone(t api.Tombstone) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	cur, ok := m.tombstones[t.AgentID]
	return ok && cur == t
}

// Reset forgets everything (the masters' cluster was rebuilt).
func (m *Membership) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records, m.tombstones, m.fromMasters = map[string]PeerRecord{}, map[string]api.Tombstone{}, map[string]bool{}
	m.horizon = 0
	m.gen++
}

// State returns the whole membership, sorted (deterministic encoding).
func (m *Membership) State() State {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var st State
	for _, id := range slices.Sorted(maps.Keys(m.records)) {
		st.Records = append(st.Records, m.records[id])
	}
	for _, id := range slices.Sorted(maps.Keys(m.tombstones)) {
		st.Tombstones = append(st.Tombstones, m.tombstones[id])
	}
	return st
}

// FromMasters lists, sorted, the agents whose record is the masters' copy
// (persisted with the state, so that the preference survives a restart).
func (m *Membership) FromMasters() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Sorted(maps.Keys(m.fromMasters))
}

// Record returns one agent's record.
func (m *Membership) Record(id string) (PeerRecord, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.records[id]
	return r, ok
}

// Tombstone returns the version at which an agent was deleted.
func (m *Membership) Tombstone(id string) (uint64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	t, ok := m.tombstones[id]
	return t.Version, ok
}

// Len is the number of live records.
func (m *Membership) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.records)
}

// MeshPeer is another agent's id and mesh address.
type MeshPeer struct {
	ID, Addr string
}

// MeshPeers lists the agents other than self with a mesh address, and the
// ids with a record or a tombstone.
func (m *Membership) MeshPeers(self string) ([]MeshPeer, map[string]bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	known := make(map[string]bool, len(m.records)+len(m.tombstones))
	var out []MeshPeer
	for id, r := range m.records {
		known[id] = true
		if id != self && r.MeshAddr != "" {
			out = append(out, MeshPeer{ID: id, Addr: r.MeshAddr})
		}
	}
	for id := range m.tombstones {
		known[id] = true
	}
	return out, known
}
