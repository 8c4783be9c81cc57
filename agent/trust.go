package agent

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

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
// refused and counted by reason; it changes nothing.
//
// The key comes from --signing-pub-file, or else from the first master
// state read (over TLS, whose certificate was verified against the cluster
// CA), and is then pinned in the agent's store: a state carrying another
// key is refused, unless it is of a rebuilt cluster (another cluster id).
// Only an agent that runs --insecure against plain http masters that sign
// nothing goes without: it logs a warning and checks the ranges alone.

// Reasons a record or tombstone is refused (the reason label of
// carve_agent_gossip_refused_total and carve_agent_master_records_refused_total).
const (
	refusedUnsigned     = "unsigned"
	refusedBadSignature = "bad_signature"
	refusedOutOfRange   = "out_of_range"
	refusedOtherCluster = "other_cluster"
)

// Reasons a whole master state is refused (carve_agent_master_states_refused_total).
const (
	stateRefusedKey      = "signing_key"
	stateRefusedUnsigned = "unsigned"
)

// Errors of keyAfter, by the reason they are counted under.
var (
	errStateKey      = errors.New("refusing the masters' state: its signing key is not the one this agent trusts")
	errStateUnsigned = errors.New("refusing the masters' state: it is unsigned")
)

// trust is what records and tombstones are checked against: a snapshot of
// the agent's cluster id, verification key and network configuration.
type trust struct {
	clusterID string
	// key verifies signatures; nil with required false: nothing is
	// verified (--insecure with masters that sign nothing).
	key      ed25519.PublicKey
	required bool
	// network is the configuration the ranges are checked against; nil
	// when none is known yet.
	network *api.NetworkConfig
}

// refusal is one record or tombstone refused, and why.
type refusal struct {
	reason string
	err    error
}

// checkSignature checks a signature (of a record or a tombstone) with
// verify, which calls the api's verifier.
func (tr *trust) checkSignature(sig string, verify func() error) (string, error) {
	switch {
	case !tr.required:
		return "", nil
	case sig == "":
		return refusedUnsigned, errors.New("unsigned")
	case tr.key == nil:
		return refusedBadSignature, fmt.Errorf("%w: no verification key yet (no master state read, no --signing-pub-file)", api.ErrBadSignature)
	}
	if err := verify(); err != nil {
		return refusedBadSignature, err
	}
	return "", nil
}

// checkRecord returns why a record must be refused, or "" when it is good.
func (tr *trust) checkRecord(r *PeerRecord) refusal {
	reason, err := tr.checkSignature(r.Signature, func() error { return api.VerifyRecord(tr.key, r.signedInfo(), tr.clusterID) })
	if err != nil {
		return refusal{reason, fmt.Errorf("record of %s version %d: %w", r.ID, r.Version, err)}
	}
	if err := recordInRange(r, tr.network); err != nil {
		return refusal{refusedOutOfRange, fmt.Errorf("record of %s version %d: %w", r.ID, r.Version, err)}
	}
	return refusal{}
}

// checkTombstone returns why a tombstone must be refused, or "" when it is good.
func (tr *trust) checkTombstone(t api.Tombstone) refusal {
	reason, err := tr.checkSignature(t.Signature, func() error { return api.VerifyTombstone(tr.key, t, tr.clusterID) })
	if err != nil {
		return refusal{reason, fmt.Errorf("tombstone of %s version %d: %w", t.AgentID, t.Version, err)}
	}
	return refusal{}
}

// admit splits a membership of cluster clusterID (a gossip message, the
// masters' state, the store) into what may be merged and what is refused.
// What members already holds, exactly, is taken without a check: it was
// checked when it came first, and merging it changes nothing; so the
// periodic gossip of a whole membership costs no signature checks.
func (tr *trust) admit(clusterID string, st MembershipState, members *Membership) (MembershipState, []refusal) {
	var ok MembershipState
	var refused []refusal
	if tr.clusterID != clusterID || (tr.clusterID == "" && tr.required) {
		err := fmt.Errorf("of cluster %q, this agent is in %q", clusterID, tr.clusterID)
		for range len(st.Records) + len(st.Tombstones) {
			refused = append(refused, refusal{refusedOtherCluster, err})
		}
		return ok, refused
	}
	for _, t := range st.Tombstones {
		if members.holdsTombstone(t) {
			ok.Tombstones = append(ok.Tombstones, t)
		} else if r := tr.checkTombstone(t); r.err != nil {
			refused = append(refused, r)
		} else {
			ok.Tombstones = append(ok.Tombstones, t)
		}
	}
	for i := range st.Records {
		rec := &st.Records[i]
		if members.holds(rec) {
			ok.Records = append(ok.Records, *rec)
		} else if r := tr.checkRecord(rec); r.err != nil {
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

// keyAfter is the verification key that holds after a master state st,
// given the key of --signing-pub-file (configured), the pinned one, whether
// st is of a rebuilt cluster (another cluster id), and whether unsigned
// states are allowed (--insecure with plain http masters). An error
// (errStateKey, errStateUnsigned) refuses the state.
func keyAfter(configured, pinned ed25519.PublicKey, st *api.State, rebuilt, unsignedAllowed bool) (ed25519.PublicKey, error) {
	if st.SigningKey == "" {
		switch {
		case configured != nil:
			return nil, fmt.Errorf("%w: --signing-pub-file is given (key %s), but the masters sign nothing (start them with --signing-key-file)", errStateUnsigned, keyFingerprint(configured))
		case !unsignedAllowed:
			return nil, fmt.Errorf("%w: the masters sign nothing, and an agent that talks TLS to them requires signed records (start the masters with --signing-key-file)", errStateUnsigned)
		case pinned != nil && !rebuilt:
			return nil, fmt.Errorf("%w: the masters signed with key %s before and sign nothing now (cluster %s)", errStateUnsigned, keyFingerprint(pinned), st.ClusterID)
		}
		return nil, nil
	}
	key, err := api.ParseSigningKey(st.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStateKey, err)
	}
	switch {
	case configured != nil && !key.Equal(configured):
		return nil, fmt.Errorf("%w: the masters sign with key %s, --signing-pub-file holds %s", errStateKey, keyFingerprint(key), keyFingerprint(configured))
	case configured != nil:
		return configured, nil
	case pinned != nil && !key.Equal(pinned) && !rebuilt:
		return nil, fmt.Errorf("%w: the masters sign with key %s, this agent pinned %s from the first state of cluster %s it read; "+
			"if the masters' key was replaced on purpose, give this agent --signing-pub-file with the new signing.pub", errStateKey, keyFingerprint(key), keyFingerprint(pinned), st.ClusterID)
	}
	return key, nil
}

// keyFingerprint names a public key in logs: the first bytes of its SHA-256.
func keyFingerprint(k ed25519.PublicKey) string {
	sum := sha256.Sum256(k)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// logLimiter lets a kind of message through once per interval, so that
// what a rogue peer or a misconfigured master repeats does not flood the log.
type logLimiter struct {
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
}

func newLogLimiter(interval time.Duration) *logLimiter {
	return &logLimiter{interval: interval, last: map[string]time.Time{}}
}

// allow tells whether a message of this kind may be logged now.
func (l *logLimiter) allow(kind string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if t, ok := l.last[kind]; ok && now.Sub(t) < l.interval {
		return false
	}
	l.last[kind] = now
	return true
}
