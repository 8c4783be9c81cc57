package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
)

// PeerRecord is what an agent knows, and gossips, of another agent: the
// part of the masters' record that the masters sign
// (api.RecordSigningBytes), exactly as they wrote it, and their signature.
// Every field on the wire is signed, so a receiver can check that the
// masters wrote all of it; what the dataplane needs (the VTEP, the routed
// subnets) is derived from these fields. It is versioned by the Raft index
// of the master change that produced it.
type PeerRecord struct {
	ID       string        `json:"id"`
	IP       string        `json:"ip,omitempty"`
	MeshAddr string        `json:"mesh,omitempty"`
	Version  uint64        `json:"v"`
	Overlays []PeerOverlay `json:"overlays,omitempty"`
	// Signature is the masters' (api.AgentInfo.Signature); empty when they
	// sign nothing (--insecure masters without a signing key).
	Signature string `json:"sig,omitempty"`
}

// PeerOverlay is one overlay of a PeerRecord: the signed fields of an
// api.AgentOverlay. An absent bridge is empty addresses.
type PeerOverlay struct {
	Name      string `json:"name"`
	Subnet    string `json:"subnet,omitempty"`
	Subnet6   string `json:"subnet6,omitempty"`
	MesosIP   string `json:"mesos_ip,omitempty"`
	MesosIP6  string `json:"mesos_ip6,omitempty"`
	DockerIP  string `json:"docker_ip,omitempty"`
	DockerIP6 string `json:"docker_ip6,omitempty"`
	// VTEPIP carries the VTEP subnet's prefix length (100.64.0.2/16).
	VTEPIP  string `json:"vtep,omitempty"`
	VTEPMAC string `json:"mac,omitempty"`
	// VTEPIP6 carries vtep_subnet6's prefix length (fd01:a::2/64).
	VTEPIP6 string `json:"vtep6,omitempty"`
	// Blocks are the agent's blocks in the overlay (signed since record
	// format v2), without their used and free counts, which are not.
	Blocks []api.Block `json:"blocks,omitempty"`
}

// maxPeerBlocks bounds the blocks of one overlay of a record from the network.
const maxPeerBlocks = 4096

// maxPeerOverlays bounds the overlays of a record from the network.
const maxPeerOverlays = 64

// NewPeerRecord extracts the signed part of a master record. Overlays are
// sorted by name, as the signature covers them, so that one signed content
// has one encoding.
func NewPeerRecord(a *api.AgentInfo) PeerRecord {
	p := PeerRecord{ID: a.AgentID, IP: a.IP, MeshAddr: a.MeshAddr, Version: a.Version, Signature: a.Signature}
	for _, ov := range a.Overlays {
		po := PeerOverlay{Name: ov.Info.Name, Subnet: ov.Subnet, Subnet6: ov.Subnet6}
		if b := ov.MesosBridge; b != nil {
			po.MesosIP, po.MesosIP6 = b.IP, b.IP6
		}
		if b := ov.DockerBridge; b != nil {
			po.DockerIP, po.DockerIP6 = b.IP, b.IP6
		}
		if ov.Backend != nil && ov.Backend.VXLAN != nil {
			po.VTEPIP, po.VTEPMAC, po.VTEPIP6 = ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPMAC, ov.Backend.VXLAN.VTEPIP6
		}
		for _, b := range ov.Blocks {
			b.Used, b.Free = nil, nil
			po.Blocks = append(po.Blocks, b)
		}
		api.SortBlocks(po.Blocks)
		p.Overlays = append(p.Overlays, po)
	}
	p.sortOverlays()
	return p
}

func (p *PeerRecord) sortOverlays() {
	slices.SortStableFunc(p.Overlays, func(x, y PeerOverlay) int { return strings.Compare(x.Name, y.Name) })
}

// signedInfo rebuilds the master record's signed fields, to verify the
// signature with api.VerifyRecord: its signed encoding is the masters'.
func (p *PeerRecord) signedInfo() *api.AgentInfo {
	info := &api.AgentInfo{AgentID: p.ID, IP: p.IP, MeshAddr: p.MeshAddr, Version: p.Version, Signature: p.Signature}
	for _, po := range p.Overlays {
		ov := api.AgentOverlay{Info: api.OverlayNetwork{Name: po.Name}, Subnet: po.Subnet, Subnet6: po.Subnet6}
		if po.MesosIP != "" || po.MesosIP6 != "" {
			ov.MesosBridge = &api.BridgeInfo{IP: po.MesosIP, IP6: po.MesosIP6}
		}
		if po.DockerIP != "" || po.DockerIP6 != "" {
			ov.DockerBridge = &api.BridgeInfo{IP: po.DockerIP, IP6: po.DockerIP6}
		}
		if po.VTEPIP != "" || po.VTEPMAC != "" || po.VTEPIP6 != "" {
			ov.Backend = &api.BackendInfo{VXLAN: &api.VXLANInfo{VTEPIP: po.VTEPIP, VTEPMAC: po.VTEPMAC, VTEPIP6: po.VTEPIP6}}
		}
		ov.Blocks = po.Blocks
		info.Overlays = append(info.Overlays, ov)
	}
	return info
}

// VTEP is the agent's VTEP IP (with the VTEP subnet's prefix length) and
// MAC: those of its first overlay, by name, that has a VTEP (an agent has
// one VTEP, shown in every overlay's backend). Empty when none has.
func (p *PeerRecord) VTEP() (ip, mac string) {
	for _, ov := range p.Overlays {
		if ov.VTEPIP != "" {
			return ov.VTEPIP, ov.VTEPMAC
		}
	}
	return "", ""
}

// VTEP6 is the agent's IPv6 VTEP address (with vtep_subnet6's prefix
// length), from the same overlay as VTEP; empty without one.
func (p *PeerRecord) VTEP6() string {
	for _, ov := range p.Overlays {
		if ov.VTEPIP != "" {
			return ov.VTEPIP6
		}
	}
	return ""
}

// HasIP tells whether the record carries an underlay IP (not api.NoIP).
func (p *PeerRecord) HasIP() bool { return p.IP != "" && p.IP != api.NoIP }

// Subnets are the agent's subnets (IPv4 and IPv6) of the overlays leased to
// it (every overlay of a record is), and its blocks outside them (grown and
// granted ones): what is routed to its VTEP. A block granted away from a
// donor's subnet is the recipient's longer prefix, so the recipient's route
// wins. The status the agent reported is not consulted: it is not signed,
// and a lease is routed whatever its owner reported.
func (p *PeerRecord) Subnets() []string {
	var out []string
	for _, ov := range p.Overlays {
		var own []netip.Prefix
		for _, s := range []string{ov.Subnet, ov.Subnet6} {
			if s != "" {
				out = append(out, s)
				if pr, err := netip.ParsePrefix(s); err == nil {
					own = append(own, pr)
				}
			}
		}
		for _, b := range ov.Blocks {
			pr, err := netip.ParsePrefix(b.Prefix)
			if err != nil || slices.ContainsFunc(own, func(s netip.Prefix) bool { return s.Bits() <= pr.Bits() && s.Contains(pr.Addr()) }) {
				continue
			}
			out = append(out, b.Prefix)
		}
	}
	return out
}

// LeasePrefixes are the agent's blocks of every overlay, as the masters
// list them (its subnets for a record without blocks): its complete lease
// set, which the rings are seeded with.
func (p *PeerRecord) LeasePrefixes() []string {
	var out []string
	for _, ov := range p.Overlays {
		if len(ov.Blocks) == 0 {
			for _, s := range []string{ov.Subnet, ov.Subnet6} {
				if s != "" {
					out = append(out, s)
				}
			}
			continue
		}
		for _, b := range ov.Blocks {
			out = append(out, b.Prefix)
		}
	}
	return out
}

// Validate checks a record that came from the network: its syntax. Whether
// the masters signed it, and whether it lies inside the network
// configuration, is the trust's to check (see trust.checkRecord).
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
	if len(p.Signature) > 128 {
		return fmt.Errorf("record %s: a signature of %d bytes", p.ID, len(p.Signature))
	}
	if len(p.Overlays) > maxPeerOverlays {
		return fmt.Errorf("record %s: %d overlays", p.ID, len(p.Overlays))
	}
	seen := map[string]bool{}
	for _, ov := range p.Overlays {
		if err := ov.validate(); err != nil {
			return fmt.Errorf("record %s: %w", p.ID, err)
		}
		if seen[ov.Name] {
			return fmt.Errorf("record %s: overlay %q twice", p.ID, ov.Name)
		}
		seen[ov.Name] = true
	}
	return nil
}

func (ov *PeerOverlay) validate() error {
	if err := api.ValidateOverlayName(ov.Name); err != nil {
		return err
	}
	for _, s := range []struct {
		name, v string
		masked  bool
	}{
		{"subnet", ov.Subnet, true}, {"subnet6", ov.Subnet6, true},
		{"mesos_ip", ov.MesosIP, false}, {"mesos_ip6", ov.MesosIP6, false},
		{"docker_ip", ov.DockerIP, false}, {"docker_ip6", ov.DockerIP6, false},
	} {
		if s.v == "" {
			continue
		}
		pr, err := netip.ParsePrefix(s.v)
		if err != nil || (s.masked && pr.Masked() != pr) {
			return fmt.Errorf("overlay %s: %s %q", ov.Name, s.name, s.v)
		}
	}
	if len(ov.Blocks) > maxPeerBlocks {
		return fmt.Errorf("overlay %s: %d blocks", ov.Name, len(ov.Blocks))
	}
	for _, b := range ov.Blocks {
		pr, err := netip.ParsePrefix(b.Prefix)
		if err != nil || pr.Masked() != pr {
			return fmt.Errorf("overlay %s: block %q", ov.Name, b.Prefix)
		}
		if b.Bridge != api.BridgeMesos && b.Bridge != api.BridgeDocker {
			return fmt.Errorf("overlay %s: block %s: bridge %q", ov.Name, b.Prefix, b.Bridge)
		}
		switch b.Origin {
		case api.BlockLeased, api.BlockGrown, api.BlockGranted:
		default:
			return fmt.Errorf("overlay %s: block %s: origin %q", ov.Name, b.Prefix, b.Origin)
		}
		if b.Donor != "" {
			if err := api.ValidateAgentID(b.Donor); err != nil {
				return fmt.Errorf("overlay %s: block %s: donor: %w", ov.Name, b.Prefix, err)
			}
		}
	}
	if ov.VTEPIP != "" || ov.VTEPMAC != "" {
		pr, err := netip.ParsePrefix(ov.VTEPIP)
		if err != nil || !pr.Addr().Is4() {
			return fmt.Errorf("overlay %s: vtep ip %q is not IPv4/prefix", ov.Name, ov.VTEPIP)
		}
		mac, err := net.ParseMAC(ov.VTEPMAC)
		if err != nil || len(mac) != 6 {
			return fmt.Errorf("overlay %s: vtep mac %q", ov.Name, ov.VTEPMAC)
		}
	}
	if ov.VTEPIP6 != "" {
		pr, err := netip.ParsePrefix(ov.VTEPIP6)
		if err != nil || pr.Addr().Is4() || pr.Addr().Zone() != "" {
			return fmt.Errorf("overlay %s: vtep ip6 %q is not IPv6/prefix", ov.Name, ov.VTEPIP6)
		}
	}
	return nil
}

func (p *PeerRecord) equal(o *PeerRecord) bool {
	return p.ID == o.ID && p.IP == o.IP && p.MeshAddr == o.MeshAddr && p.Version == o.Version &&
		p.Signature == o.Signature && slices.EqualFunc(p.Overlays, o.Overlays, PeerOverlay.equal)
}

func (ov PeerOverlay) equal(o PeerOverlay) bool {
	return ov.Name == o.Name && ov.Subnet == o.Subnet && ov.Subnet6 == o.Subnet6 &&
		ov.MesosIP == o.MesosIP && ov.MesosIP6 == o.MesosIP6 && ov.DockerIP == o.DockerIP && ov.DockerIP6 == o.DockerIP6 &&
		ov.VTEPIP == o.VTEPIP && ov.VTEPMAC == o.VTEPMAC && ov.VTEPIP6 == o.VTEPIP6 && slices.Equal(ov.Blocks, o.Blocks)
}

// MembershipState is the whole membership: records and tombstones, with
// the masters' signatures. It is the gossip payload and what is persisted.
type MembershipState struct {
	Records    []PeerRecord    `json:"records,omitempty"`
	Tombstones []api.Tombstone `json:"tombstones,omitempty"`
}

// MembershipMessage is a membership gossip message: a state and the
// masters' cluster its records come from. Records of another cluster (from
// before a rebuild of the masters) mean nothing in this one; the signatures
// cover the cluster id, so a record cannot be moved to another.
type MembershipMessage struct {
	// ClusterID is the sender's cluster (api.State.ClusterID); empty when
	// the sender has not learnt one.
	ClusterID string `json:"cluster_id,omitempty"`
	// MembershipState is a delta: the records and tombstones that changed
	// (a broadcast, a relay), or those a peer lacks (an anti-entropy push).
	MembershipState
	// From and Digest are an anti-entropy digest (see antientropy.go) and
	// its sender, who is answered by unicast.
	From   string `json:"from,omitempty"`
	Digest []byte `json:"digest,omitempty"`
	// Summary answers a digest (unicast), Want a summary (unicast).
	Summary *DigestSummary `json:"summary,omitempty"`
	Want    []string       `json:"want,omitempty"`
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
// local store's is as large as the cluster. Overlays are put in the order
// NewPeerRecord gives them (the signature does not depend on it).
func decodeMembership(data []byte) (MembershipMessage, error) {
	var msg MembershipMessage
	if err := json.Unmarshal(data, &msg); err != nil {
		return MembershipMessage{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
	}
	for i := range msg.Records {
		if err := msg.Records[i].Validate(); err != nil {
			return MembershipMessage{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
		}
		msg.Records[i].sortOverlays()
	}
	for _, t := range msg.Tombstones {
		if err := api.ValidateAgentID(t.AgentID); err != nil || t.Version == 0 || len(t.Signature) > 128 {
			return MembershipMessage{}, fmt.Errorf("%w: tombstone %q at %d", ErrBadGossip, t.AgentID, t.Version)
		}
	}
	if err := validateAntiEntropy(&msg); err != nil {
		return MembershipMessage{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
	}
	return msg, nil
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

	// sums caches the anti-entropy digest entry of every agent id (see
	// antientropy.go), under sumMu, refreshed from the maps above when gen
	// moved past sumsGen; digest caches the digest of digestN buckets of
	// those sums (digestN 0: none).
	sumMu   sync.Mutex
	sums    map[string]*idSum
	sumsGen uint64
	digest  []byte
	digestN int
}

// NewMembership returns an empty membership.
func NewMembership() *Membership {
	return &Membership{records: map[string]PeerRecord{}, tombstones: map[string]api.Tombstone{}, fromMasters: map[string]bool{}}
}

// Merge merges a state heard from gossip and returns the part of it that
// was news (empty when nothing changed).
func (m *Membership) Merge(st MembershipState) MembershipState { return m.merge(st, false) }

// MergeFromMasters merges records and tombstones of the masters' state:
// as Merge, except that at an equal version the masters' copy of a record
// replaces any other.
func (m *Membership) MergeFromMasters(st MembershipState) MembershipState { return m.merge(st, true) }

func (m *Membership) merge(st MembershipState, masters bool) MembershipState {
	m.mu.Lock()
	defer m.mu.Unlock()
	var news MembershipState
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
		case cur.Version == r.Version && cur.equal(&r):
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

// holds tells whether the membership has exactly this record (same
// version, content and signature): merging it changes nothing, and it was
// checked when it first came.
func (m *Membership) holds(r *PeerRecord) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	cur, ok := m.records[r.ID]
	return ok && cur.equal(r)
}

// holdsTombstone is holds for a tombstone.
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
func (m *Membership) State() MembershipState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var st MembershipState
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

// membershipData is gossip data of one cluster: a delta (a
// MembershipState of what changed) and, for periodic gossip, a digest.
type membershipData struct {
	clusterID string
	st        MembershipState
	// from and digest: this agent's anti-entropy digest; nil for a delta alone.
	from   string
	digest []byte
	// sent, when set, counts the bytes of every encoding (each is sent once).
	sent func(kind string, n int)
}

// Encode implements gossip.Data.
func (d membershipData) Encode() [][]byte {
	b := encodeMessage(MembershipMessage{ClusterID: d.clusterID, MembershipState: d.st, From: d.from, Digest: d.digest})
	if b == nil {
		return nil
	}
	if d.sent != nil {
		kind := "delta"
		if d.digest != nil {
			kind = "digest"
		}
		d.sent(kind, len(b))
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
	out := o // the later digest, if any
	if out.digest == nil {
		out.from, out.digest = d.from, d.digest
	}
	if out.sent == nil {
		out.sent = d.sent
	}
	switch {
	case len(d.st.Records)+len(d.st.Tombstones) == 0:
	case len(o.st.Records)+len(o.st.Tombstones) == 0:
		out.st = d.st
	default:
		m := NewMembership()
		m.Merge(d.st)
		m.Merge(o.st)
		out.st = m.State()
	}
	return out
}
