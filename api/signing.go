package api

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Signed records.
//
// The masters sign every agent record and tombstone they publish with the
// cluster's ed25519 record-signing key (signing.key of `carve certs ca`), so
// that an agent can accept a record it heard from another agent (gossip)
// only when the masters wrote it. The signature covers a canonical
// encoding of exactly the fields an agent acts on, plus the cluster id (a
// record of another cluster, signed with the same key, does not verify):
//
// RecordSigningBytes, format version 3:
//
//	"carve-record-v3" 0x00
//	str(cluster_id) str(agent_id) str(ip) str(mesh_addr) u64(version)
//	str(keys.claim) str(keys.wireguard) u32(underlay_mtu)
//	u32(number of overlays), then per overlay, sorted by name:
//	  str(info.name) str(subnet) str(subnet6)
//	  str(mesos_bridge.ip) str(mesos_bridge.ip6)
//	  str(docker_bridge.ip) str(docker_bridge.ip6)
//	  str(backend.vxlan.vtep_ip) str(backend.vxlan.vtep_mac)
//	  str(backend.vxlan.vtep_ip6)
//	  u32(number of blocks), then per block, sorted by bridge, prefix,
//	  origin, donor (byte-wise string order):
//	    str(bridge) str(prefix) str(origin) str(donor) u64(version)
//
// Version 2 (from version 1) leaves out state.status, which is what the
// agent reported after configuring the overlay, not a lease (an agent acts
// on its leases, never on a status); adds vtep_ip6, which agents program
// for their peers; and adds the blocks (an agent routes and allocates in
// every block of a record it gossips, so a peer must not be able to add
// one). Version 1 records do not verify as version 2 ones.
//
// Version 3 (from version 2) adds the agent's public keys and its
// underlay MTU: a peer accepts an agent's claims on address space only
// under its claim key, encrypts to it with its WireGuard key, and sizes
// the overlay's MTU by the smallest underlay, so none of them may come
// from anyone but the masters. Version 2 records do not verify as
// version 3 ones.
//
// TombstoneSigningBytes, format version 1:
//
//	"carve-tombstone-v1" 0x00 str(cluster_id) str(agent_id) u64(version)
//
// where str(s) is s's length as a big-endian uint32 followed by its bytes,
// u64 and u32 are big-endian, and an absent bridge or backend contributes
// empty strings. Strings are signed exactly as they travel in the JSON (no
// re-formatting of addresses), so a verifier needs no parsing to check.
// Everything else in a record (hostname, network_config, the overlay's
// info beyond its name, the VTEP's VNI, name, port and MTU, state,
// configuration_attempts, not_leased) is not signed, nor a block's used
// and free counts: those come from the network configuration in the state,
// or are informational. A change of the format is a new version string.
//
// The signature travels as AgentInfo.Signature and Tombstone.Signature:
// standard base64 of the 64-byte ed25519 signature. The public key is
// State.SigningKey (EncodeSigningKey) and signing.pub (PEM).

// Domain separators of the signed encodings: a record's bytes never verify
// as a tombstone's, and a new format gets a new separator.
const (
	recordSigningDomain    = "carve-record-v3\x00"
	tombstoneSigningDomain = "carve-tombstone-v1\x00"
)

// ErrBadSignature marks a record or tombstone whose signature is missing,
// malformed or does not verify with the masters' key.
var ErrBadSignature = errors.New("bad signature")

// RecordSigningBytes is the canonical encoding of an agent record that the
// masters sign (format above). It does not read info.Signature.
func RecordSigningBytes(info *AgentInfo, clusterID string) []byte {
	b := make([]byte, 0, 256)
	b = append(b, recordSigningDomain...)
	b = appendString(b, clusterID)
	b = appendString(b, info.AgentID)
	b = appendString(b, info.IP)
	b = appendString(b, info.MeshAddr)
	b = binary.BigEndian.AppendUint64(b, info.Version)
	b = appendString(b, info.Keys.Claim)
	b = appendString(b, info.Keys.WireGuard)
	b = binary.BigEndian.AppendUint32(b, uint32(max(info.UnderlayMTU, 0)))
	overlays := slices.SortedFunc(slices.Values(info.Overlays), func(x, y AgentOverlay) int {
		return strings.Compare(x.Info.Name, y.Info.Name)
	})
	b = binary.BigEndian.AppendUint32(b, uint32(len(overlays)))
	for _, ov := range overlays {
		b = appendString(b, ov.Info.Name)
		b = appendString(b, ov.Subnet)
		b = appendString(b, ov.Subnet6)
		for _, br := range []*BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
			var ip, ip6 string
			if br != nil {
				ip, ip6 = br.IP, br.IP6
			}
			b = appendString(b, ip)
			b = appendString(b, ip6)
		}
		var vtepIP, vtepMAC, vtepIP6 string
		if ov.Backend != nil && ov.Backend.VXLAN != nil {
			vtepIP, vtepMAC, vtepIP6 = ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPMAC, ov.Backend.VXLAN.VTEPIP6
		}
		b = appendString(b, vtepIP)
		b = appendString(b, vtepMAC)
		b = appendString(b, vtepIP6)
		b = appendBlocks(b, ov.Blocks)
	}
	return b
}

// appendBlocks appends an overlay's blocks in their signed order.
func appendBlocks(b []byte, blocks []Block) []byte {
	sorted := slices.SortedFunc(slices.Values(blocks), compareBlocks)
	b = binary.BigEndian.AppendUint32(b, uint32(len(sorted)))
	for _, bl := range sorted {
		b = appendString(b, bl.Bridge)
		b = appendString(b, bl.Prefix)
		b = appendString(b, bl.Origin)
		b = appendString(b, bl.Donor)
		b = binary.BigEndian.AppendUint64(b, bl.Version)
	}
	return b
}

// compareBlocks is the order of blocks in the signed encoding (and in the
// masters' records): bridge, prefix, origin, donor.
func compareBlocks(x, y Block) int {
	if c := strings.Compare(x.Bridge, y.Bridge); c != 0 {
		return c
	}
	if c := strings.Compare(x.Prefix, y.Prefix); c != 0 {
		return c
	}
	if c := strings.Compare(x.Origin, y.Origin); c != 0 {
		return c
	}
	return strings.Compare(x.Donor, y.Donor)
}

// SortBlocks sorts blocks in the order the signature covers them.
func SortBlocks(blocks []Block) { slices.SortFunc(blocks, compareBlocks) }

// TombstoneSigningBytes is the canonical encoding of a tombstone that the
// masters sign (format above). It does not read t.Signature.
func TombstoneSigningBytes(t Tombstone, clusterID string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, tombstoneSigningDomain...)
	b = appendString(b, clusterID)
	b = appendString(b, t.AgentID)
	return binary.BigEndian.AppendUint64(b, t.Version)
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// Sign returns the signature of msg in its wire form (standard base64).
func Sign(key ed25519.PrivateKey, msg []byte) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))
}

// VerifyRecord checks an agent record's signature; the error wraps
// ErrBadSignature and names the agent.
func VerifyRecord(pub ed25519.PublicKey, info *AgentInfo, clusterID string) error {
	if err := verify(pub, RecordSigningBytes(info, clusterID), info.Signature); err != nil {
		return fmt.Errorf("record of agent %q version %d: %w", info.AgentID, info.Version, err)
	}
	return nil
}

// VerifyTombstone checks a tombstone's signature; the error wraps
// ErrBadSignature and names the agent.
func VerifyTombstone(pub ed25519.PublicKey, t Tombstone, clusterID string) error {
	if err := verify(pub, TombstoneSigningBytes(t, clusterID), t.Signature); err != nil {
		return fmt.Errorf("tombstone of agent %q version %d: %w", t.AgentID, t.Version, err)
	}
	return nil
}

func verify(pub ed25519.PublicKey, msg []byte, sig string) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: no valid verification key (%d bytes)", ErrBadSignature, len(pub))
	}
	if sig == "" {
		return fmt.Errorf("%w: unsigned", ErrBadSignature)
	}
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("%w: signature is not base64 of %d bytes", ErrBadSignature, ed25519.SignatureSize)
	}
	if !ed25519.Verify(pub, msg, raw) {
		return fmt.Errorf("%w: does not verify with the masters' key", ErrBadSignature)
	}
	return nil
}

// EncodeSigningKey is the wire form of the masters' public record-signing
// key (State.SigningKey): standard base64 of the 32 raw bytes.
func EncodeSigningKey(pub ed25519.PublicKey) string {
	return base64.StdEncoding.EncodeToString(pub)
}

// ParseSigningKey decodes State.SigningKey.
func ParseSigningKey(s string) (ed25519.PublicKey, error) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("signing_key %q: want standard base64 of a %d-byte ed25519 public key", s, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}
