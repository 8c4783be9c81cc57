package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
)

// PeerRecord is what an agent needs to know of another agent to reach its
// containers: its underlay IP, VTEP and the subnets routed to it. It is
// versioned by the Raft index of the master change that produced it.
type PeerRecord struct {
	ID       string `json:"id"`
	IP       string `json:"ip,omitempty"`
	MeshAddr string `json:"mesh,omitempty"`
	Version  uint64 `json:"v"`
	// VTEPIP carries the VTEP subnet's prefix length (100.64.0.2/16).
	VTEPIP  string `json:"vtep,omitempty"`
	VTEPMAC string `json:"mac,omitempty"`
	// Subnets are the agent's subnets of the enabled overlays (IPv4 and IPv6).
	Subnets []string `json:"subnets,omitempty"`
}

// peerFromInfo extracts a PeerRecord from a master record.
func peerFromInfo(a *api.AgentInfo) PeerRecord {
	p := PeerRecord{ID: a.AgentID, IP: a.IP, MeshAddr: a.MeshAddr, Version: a.Version}
	for _, ov := range a.Overlays {
		if ov.Backend != nil && ov.Backend.VXLAN != nil && p.VTEPIP == "" {
			p.VTEPIP, p.VTEPMAC = ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPMAC
		}
		if ov.State.Status != api.StatusOK {
			continue
		}
		for _, s := range []string{ov.Subnet, ov.Subnet6} {
			if s != "" {
				p.Subnets = append(p.Subnets, s)
			}
		}
	}
	return p
}

// Validate checks a record that came from the network.
func (p *PeerRecord) Validate() error {
	if err := api.ValidateAgentID(p.ID); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if p.Version == 0 {
		return fmt.Errorf("record %s: version 0", p.ID)
	}
	if p.IP != "" {
		if _, err := netip.ParseAddr(p.IP); err != nil {
			return fmt.Errorf("record %s: ip %q: %w", p.ID, p.IP, err)
		}
	}
	if p.MeshAddr != "" {
		if _, err := netip.ParseAddrPort(p.MeshAddr); err != nil {
			return fmt.Errorf("record %s: mesh address %q: %w", p.ID, p.MeshAddr, err)
		}
	}
	if p.VTEPIP != "" {
		pr, err := netip.ParsePrefix(p.VTEPIP)
		if err != nil || !pr.Addr().Is4() {
			return fmt.Errorf("record %s: vtep ip %q is not IPv4/prefix", p.ID, p.VTEPIP)
		}
		mac, err := net.ParseMAC(p.VTEPMAC)
		if err != nil || len(mac) != 6 {
			return fmt.Errorf("record %s: vtep mac %q", p.ID, p.VTEPMAC)
		}
	}
	if len(p.Subnets) > 64 {
		return fmt.Errorf("record %s: %d subnets", p.ID, len(p.Subnets))
	}
	for _, s := range p.Subnets {
		pr, err := netip.ParsePrefix(s)
		if err != nil || pr.Masked() != pr {
			return fmt.Errorf("record %s: subnet %q", p.ID, s)
		}
	}
	return nil
}

func (p *PeerRecord) equal(o *PeerRecord) bool {
	return p.ID == o.ID && p.IP == o.IP && p.MeshAddr == o.MeshAddr && p.Version == o.Version &&
		p.VTEPIP == o.VTEPIP && p.VTEPMAC == o.VTEPMAC && slices.Equal(p.Subnets, o.Subnets)
}

// MembershipState is the whole membership: records and tombstones. It is the
// gossip payload and what is persisted.
type MembershipState struct {
	Records    []PeerRecord    `json:"records,omitempty"`
	Tombstones []api.Tombstone `json:"tombstones,omitempty"`
}

// MembershipMessage is a membership gossip message: a state and the
// masters' cluster its records come from. Records of another cluster (from
// before a rebuild of the masters) mean nothing in this one.
type MembershipMessage struct {
	// ClusterID is the sender's cluster (api.State.ClusterID); empty when
	// the sender has not learnt one.
	ClusterID string `json:"cluster_id,omitempty"`
	MembershipState
}

// maxGossipBytes bounds a decoded membership message (mesh's own limit is 10 MiB).
const maxGossipBytes = 8 << 20

// ErrBadGossip marks a membership message that cannot be decoded.
var ErrBadGossip = errors.New("bad membership message")

// DecodeMembership decodes and validates a membership message from the
// network, of at most maxGossipBytes. Invalid records are an error for the
// whole message: a peer that sends garbage is broken, and merging half of
// it would hide that.
func DecodeMembership(data []byte) (MembershipMessage, error) {
	if len(data) > maxGossipBytes {
		return MembershipMessage{}, fmt.Errorf("%w: %d bytes", ErrBadGossip, len(data))
	}
	return decodeMembership(data)
}

// decodeMembership decodes and validates a membership of any size: the
// local store's is as large as the cluster.
func decodeMembership(data []byte) (MembershipMessage, error) {
	var msg MembershipMessage
	if err := json.Unmarshal(data, &msg); err != nil {
		return MembershipMessage{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
	}
	for i := range msg.Records {
		if err := msg.Records[i].Validate(); err != nil {
			return MembershipMessage{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
		}
	}
	for _, t := range msg.Tombstones {
		if err := api.ValidateAgentID(t.AgentID); err != nil || t.Version == 0 {
			return MembershipMessage{}, fmt.Errorf("%w: tombstone %q at %d", ErrBadGossip, t.AgentID, t.Version)
		}
	}
	return msg, nil
}

// Membership is the set of agents this agent knows, merged from the masters'
// state and from gossip by one rule: per agent id, the highest version wins,
// and a tombstone wins over records of lower or equal version. That rule is
// a join (commutative, associative, idempotent), so gossip order and
// duplicates do not matter, and a late, older record never resurrects a
// deleted agent.
type Membership struct {
	mu         sync.RWMutex
	records    map[string]PeerRecord
	tombstones map[string]uint64
}

// NewMembership returns an empty membership.
func NewMembership() *Membership {
	return &Membership{records: map[string]PeerRecord{}, tombstones: map[string]uint64{}}
}

// Merge merges a state and returns the part of it that was news (empty when
// nothing changed).
func (m *Membership) Merge(st MembershipState) MembershipState {
	m.mu.Lock()
	defer m.mu.Unlock()
	var news MembershipState
	for _, t := range st.Tombstones {
		if m.mergeTombstone(t.AgentID, t.Version) {
			news.Tombstones = append(news.Tombstones, t)
		}
	}
	for _, r := range st.Records {
		if m.mergeRecord(r) {
			news.Records = append(news.Records, r)
		}
	}
	return news
}

func (m *Membership) mergeRecord(r PeerRecord) bool {
	if tv, ok := m.tombstones[r.ID]; ok && tv >= r.Version {
		return false
	}
	if cur, ok := m.records[r.ID]; ok {
		// A version is the Raft index of the change, so equal versions
		// carry equal records; the comparison keeps the merge a join even
		// if a buggy peer sends two versions of one index.
		if cur.Version > r.Version || (cur.Version == r.Version && !recordLess(&cur, &r)) {
			return false
		}
	}
	r.Subnets = slices.Clone(r.Subnets)
	m.records[r.ID] = r
	return true
}

// recordLess orders two records of the same version deterministically.
func recordLess(a, b *PeerRecord) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) < string(jb)
}

func (m *Membership) mergeTombstone(id string, v uint64) bool {
	if cur, ok := m.tombstones[id]; ok && cur >= v {
		return false
	}
	m.tombstones[id] = v
	if r, ok := m.records[id]; ok && r.Version <= v {
		delete(m.records, id)
	}
	return true
}

// Reset forgets everything (the masters' cluster was rebuilt).
func (m *Membership) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records, m.tombstones = map[string]PeerRecord{}, map[string]uint64{}
}

// State returns the whole membership, sorted (deterministic encoding).
func (m *Membership) State() MembershipState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var st MembershipState
	for _, id := range slices.Sorted(maps.Keys(m.records)) {
		st.Records = append(st.Records, m.records[id])
	}
	for _, id := range slices.Sorted(maps.Keys(m.tombstones)) {
		st.Tombstones = append(st.Tombstones, api.Tombstone{AgentID: id, Version: m.tombstones[id]})
	}
	return st
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
	v, ok := m.tombstones[id]
	return v, ok
}

// Len is the number of live records.
func (m *Membership) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.records)
}

// membershipData is a MembershipState of one cluster as gossip data.
type membershipData struct {
	clusterID string
	st        MembershipState
}

// Encode implements gossip.Data.
func (d membershipData) Encode() [][]byte {
	b, err := json.Marshal(MembershipMessage{ClusterID: d.clusterID, MembershipState: d.st})
	if err != nil {
		return nil
	}
	return [][]byte{b}
}

// Merge implements gossip.Data: the join of both states. States of two
// clusters do not join: only this agent's queued sends are merged, and the
// later one (other) is of the cluster the agent is in now.
func (d membershipData) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(membershipData)
	if !ok {
		return d
	}
	if o.clusterID != d.clusterID {
		return o
	}
	m := NewMembership()
	m.Merge(d.st)
	m.Merge(o.st)
	return membershipData{clusterID: d.clusterID, st: m.State()}
}
