package membership

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
)

// PeerRecord is what an agent knows, and gossips, of another agent: the
// part of the masters' record that the masters sign
// (api.RecordSigningBytes), exactly as they wrote it, and their signature.
// Every field on the wire is signed, so a receiver can check that the
// masters wrote all of it; what the dataplane needs (the VTEP, the routed
// subnets) is derived from these fields. It is versioned by the Raft index
// of the master change that produced it.
type PeerRecord struct {
	ID       string `json:"id"`
	IP       string `json:"ip,omitempty"`
	MeshAddr string `json:"mesh,omitempty"`
	Version  uint64 `json:"v"`
	// Keys and UnderlayMTU are the agent's (signed since record format v3).
	Keys        api.AgentKeys `json:"keys,omitzero"`
	UnderlayMTU int           `json:"mtu,omitempty"`
	Overlays    []PeerOverlay `json:"overlays,omitempty"`
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
	p := PeerRecord{ID: a.AgentID, IP: a.IP, MeshAddr: a.MeshAddr, Version: a.Version, Signature: a.Signature,
		Keys: a.Keys, UnderlayMTU: a.UnderlayMTU}
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
	info := &api.AgentInfo{AgentID: p.ID, IP: p.IP, MeshAddr: p.MeshAddr, Version: p.Version, Signature: p.Signature,
		Keys: p.Keys, UnderlayMTU: p.UnderlayMTU}
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
// configuration, is Trust's to check (Trust.Admit).
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
	if err := p.Keys.Validate(); err != nil {
		return fmt.Errorf("record %s: %w", p.ID, err)
	}
	if err := api.ValidateUnderlayMTU(p.UnderlayMTU); err != nil {
		return fmt.Errorf("record %s: %w", p.ID, err)
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

// Equal tells whether two records are the same: every field, the
// signature included.
func (p *PeerRecord) Equal(o *PeerRecord) bool {
	return p.ID == o.ID && p.IP == o.IP && p.MeshAddr == o.MeshAddr && p.Version == o.Version &&
		p.Keys == o.Keys && p.UnderlayMTU == o.UnderlayMTU && p.Signature == o.Signature && slices.EqualFunc(p.Overlays, o.Overlays, PeerOverlay.equal)
}

func (ov PeerOverlay) equal(o PeerOverlay) bool {
	return ov.Name == o.Name && ov.Subnet == o.Subnet && ov.Subnet6 == o.Subnet6 &&
		ov.MesosIP == o.MesosIP && ov.MesosIP6 == o.MesosIP6 && ov.DockerIP == o.DockerIP && ov.DockerIP6 == o.DockerIP6 &&
		ov.VTEPIP == o.VTEPIP && ov.VTEPMAC == o.VTEPMAC && ov.VTEPIP6 == o.VTEPIP6 && slices.Equal(ov.Blocks, o.Blocks)
}
