package membership

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/carve-net/carve/api"
)

// Trust in agent records.
//
// The masters sign every record and tombstone they publish (api/signing.go).
// An agent takes a record or tombstone, from gossip or from the masters'
// state, only when its signature verifies with the masters' public key and
// the agent's cluster id, and a record only when it lies inside the network
// configuration: its subnets inside the configured overlays, its VTEP IP in
// vtep_subnet, its MAC derived from its VTEP IP (api.VTEPMAC). What fails is
// refused and counted by reason; it changes nothing. Which key holds (given,
// or pinned from the masters' state, or followed through their signing key
// chain) is the agent's to decide: Trust is handed it.

// Reasons a record or tombstone is refused (the reason label of
// carve_agent_gossip_refused_total and carve_agent_master_records_refused_total).
const (
	RefusedUnsigned     = "unsigned"
	RefusedBadSignature = "bad_signature"
	RefusedOutOfRange   = "out_of_range"
	RefusedOtherCluster = "other_cluster"
)

// Trust is what records and tombstones are checked against: a snapshot of
// the agent's cluster id, verification key and network configuration.
type Trust struct {
	ClusterID string
	// Key verifies signatures; nil with Required false: nothing is
	// verified (--insecure with masters that sign nothing).
	Key ed25519.PublicKey
	// Previous are the keys the masters' signing key chain leads from to
	// Key, while they serve it (a rotation): what they signed still
	// verifies, so that masters switch keys one by one.
	Previous []ed25519.PublicKey
	Required bool
	// Network is the configuration the ranges are checked against; nil
	// when none is known yet.
	Network *api.NetworkConfig
	// Revoked maps the agents whose certificate the masters revoked to the
	// index of the revocation (RevokedAgents; revoked.go).
	Revoked map[string]uint64
}

// Refusal is one record or tombstone refused: why (one of the Refused
// reasons, a metric label) and the error to log.
type Refusal struct {
	Reason string
	Err    error
}

// checkSignature checks a signature (of a record or a tombstone) with
// verify, which calls the api's verifier, with Key, then with the
// previous keys.
func (tr *Trust) checkSignature(sig string, verify func(ed25519.PublicKey) error) (string, error) {
	switch {
	case !tr.Required:
		return "", nil
	case sig == "":
		return RefusedUnsigned, errors.New("unsigned")
	case tr.Key == nil:
		return RefusedBadSignature, fmt.Errorf("%w: no verification key yet (no master state read, no --signing-pub-file)", api.ErrBadSignature)
	}
	err := verify(tr.Key)
	for _, k := range tr.Previous {
		if err == nil {
			break
		}
		if verify(k) == nil {
			err = nil
		}
	}
	if err != nil {
		return RefusedBadSignature, err
	}
	return "", nil
}

// checkRecord returns why a record must be refused, or "" when it is good.
func (tr *Trust) checkRecord(r *PeerRecord) Refusal {
	reason, err := tr.checkSignature(r.Signature, func(k ed25519.PublicKey) error { return api.VerifyRecord(k, r.signedInfo(), tr.ClusterID) })
	if err != nil {
		return Refusal{reason, fmt.Errorf("record of %s version %d: %w", r.ID, r.Version, err)}
	}
	if err := recordInRange(r, tr.Network); err != nil {
		return Refusal{RefusedOutOfRange, fmt.Errorf("record of %s version %d: %w", r.ID, r.Version, err)}
	}
	return Refusal{}
}

// checkTombstone returns why a tombstone must be refused, or "" when it is good.
func (tr *Trust) checkTombstone(t api.Tombstone) Refusal {
	reason, err := tr.checkSignature(t.Signature, func(k ed25519.PublicKey) error { return api.VerifyTombstone(k, t, tr.ClusterID) })
	if err != nil {
		return Refusal{reason, fmt.Errorf("tombstone of %s version %d: %w", t.AgentID, t.Version, err)}
	}
	return Refusal{}
}

// Admit splits a membership of cluster clusterID (a gossip message, the
// masters' state, the store) into what may be merged and what is refused.
// What members already holds, exactly, is taken without a check: it was
// checked when it came first, and merging it changes nothing; so the
// periodic gossip of a whole membership costs no signature checks.
func (tr *Trust) Admit(clusterID string, st State, members *Membership) (State, []Refusal) {
	var ok State
	var refused []Refusal
	if tr.ClusterID != clusterID || (tr.ClusterID == "" && tr.Required) {
		err := fmt.Errorf("of cluster %q, this agent is in %q", clusterID, tr.ClusterID)
		for range len(st.Records) + len(st.Tombstones) {
			refused = append(refused, Refusal{RefusedOtherCluster, err})
		}
		return ok, refused
	}
	for _, t := range st.Tombstones {
		if members.holdsTombstone(t) {
			ok.Tombstones = append(ok.Tombstones, t)
		} else if r := tr.checkTombstone(t); r.Err != nil {
			refused = append(refused, r)
		} else {
			ok.Tombstones = append(ok.Tombstones, t)
		}
	}
	for i := range st.Records {
		rec := &st.Records[i]
		if r := tr.checkRevoked(rec); r.Err != nil {
			refused = append(refused, r)
		} else if members.Holds(rec) {
			ok.Records = append(ok.Records, *rec)
		} else if r := tr.checkRecord(rec); r.Err != nil {
			refused = append(refused, r)
		} else {
			ok.Records = append(ok.Records, *rec)
		}
	}
	return ok, refused
}

// recordInRange checks a record against the network configuration: every
// overlay it names is configured, its subnets (and the bridges' halves of
// them) lie inside the overlay's, its VTEP IP inside vtep_subnet (its IPv6
// VTEP address inside vtep_subnet6), and its MAC is the one derived from
// that IP.
func recordInRange(r *PeerRecord, n *api.NetworkConfig) error {
	if n == nil {
		return errors.New("no network configuration known yet to check it against")
	}
	var vtepNet netip.Prefix
	var oui [3]byte
	for _, ov := range r.Overlays {
		def := configuredOverlay(n, ov.Name)
		if def == nil {
			return fmt.Errorf("overlay %q is not in the network configuration", ov.Name)
		}
		for _, c := range []struct {
			what, v, parent string
		}{
			{"subnet", ov.Subnet, def.Subnet}, {"subnet6", ov.Subnet6, def.Subnet6},
			{"mesos bridge", ov.MesosIP, ov.Subnet}, {"mesos bridge", ov.MesosIP6, ov.Subnet6},
			{"docker bridge", ov.DockerIP, ov.Subnet}, {"docker bridge", ov.DockerIP6, ov.Subnet6},
		} {
			if c.v == "" {
				continue
			}
			if !prefixWithin(c.v, c.parent) {
				return fmt.Errorf("overlay %s: %s %s is outside %q", ov.Name, c.what, c.v, c.parent)
			}
		}
		for _, b := range ov.Blocks {
			parent := def.Subnet
			if pr, err := netip.ParsePrefix(b.Prefix); err == nil && !pr.Addr().Is4() {
				parent = def.Subnet6
			}
			if !prefixWithin(b.Prefix, parent) {
				return fmt.Errorf("overlay %s: block %s is outside %q", ov.Name, b.Prefix, parent)
			}
		}
		if ov.VTEPIP == "" && ov.VTEPMAC == "" {
			continue
		}
		if !vtepNet.IsValid() {
			var err error
			if vtepNet, err = netip.ParsePrefix(n.VTEPSubnet); err != nil {
				return fmt.Errorf("the network configuration's vtep_subnet %q: %w", n.VTEPSubnet, err)
			}
			mac, err := net.ParseMAC(n.VTEPMACOUI)
			if err != nil || len(mac) != 6 {
				return fmt.Errorf("the network configuration's vtep_mac_oui %q is not a MAC", n.VTEPMACOUI)
			}
			copy(oui[:], mac[:3])
		}
		vtep, err := netip.ParsePrefix(ov.VTEPIP)
		if err != nil || !vtepNet.Contains(vtep.Addr()) || vtep.Bits() != vtepNet.Bits() {
			return fmt.Errorf("overlay %s: vtep ip %s is outside vtep_subnet %s", ov.Name, ov.VTEPIP, n.VTEPSubnet)
		}
		mac, err := net.ParseMAC(ov.VTEPMAC)
		if want := api.VTEPMAC(oui, vtep.Addr()); err != nil || mac.String() != want.String() {
			return fmt.Errorf("overlay %s: vtep mac %s is not %s, derived from vtep ip %s", ov.Name, ov.VTEPMAC, want, ov.VTEPIP)
		}
		if ov.VTEPIP6 != "" {
			vtep6, err := netip.ParsePrefix(ov.VTEPIP6)
			net6, err6 := netip.ParsePrefix(n.VTEPSubnet6)
			if err != nil || err6 != nil || !net6.Contains(vtep6.Addr()) || vtep6.Bits() != net6.Bits() {
				return fmt.Errorf("overlay %s: vtep ip6 %s is outside vtep_subnet6 %q", ov.Name, ov.VTEPIP6, n.VTEPSubnet6)
			}
		}
	}
	return nil
}

func configuredOverlay(n *api.NetworkConfig, name string) *api.OverlayNetwork {
	for i := range n.Overlays {
		if n.Overlays[i].Name == name {
			return &n.Overlays[i]
		}
	}
	return nil
}

// prefixWithin tells whether prefix child lies inside prefix parent.
func prefixWithin(child, parent string) bool {
	c, err := netip.ParsePrefix(child)
	if err != nil {
		return false
	}
	p, err := netip.ParsePrefix(parent)
	if err != nil {
		return false
	}
	return c.Addr().Is4() == p.Addr().Is4() && c.Bits() >= p.Bits() && p.Contains(c.Addr())
}
