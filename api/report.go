package api

import (
	"crypto/sha256"
	"encoding/hex"
)

// An agent's configuration report (PUT /overlay-master/agents/{id}/report).

// OverlayReport is an agent's result of configuring one overlay.
type OverlayReport struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// ReportRequest is the body of PUT /overlay-master/agents/{id}/report: the
// agent's configuration result per leased overlay, for its record at
// Version (a later record shows STATUS_CONFIGURING until reported again).
type ReportRequest struct {
	Version               uint64          `json:"version"`
	Overlays              []OverlayReport `json:"overlays"`
	ConfigurationAttempts uint32          `json:"configuration_attempts"`
	RequestID             string          `json:"request_id,omitempty"`
	// SigningKey is the masters' record-signing key the agent verifies
	// records with now (EncodeSigningKey); absent from agents that verify
	// nothing or predate it. A signing-key rotation is finished only when
	// every live agent reports the new key.
	SigningKey string `json:"signing_key,omitempty"`
	// Refusing says why the agent refuses what the masters serve (their
	// state's signing key, records that do not verify, saved records that
	// no longer verify): it keeps its kernel as it is until it holds a
	// verified state. Empty while it takes the masters' state.
	Refusing string `json:"refusing,omitempty"`
	// ProgrammedPeers is how many peers the agent's kernel holds, as its
	// last reconcile programmed them from a membership holding the
	// masters' state up to PeersIndex; absent from agents that predate it.
	// The masters compare it with the peers their records at PeersIndex
	// give the agent (carve cluster status).
	ProgrammedPeers *int   `json:"programmed_peers,omitempty"`
	PeersIndex      uint64 `json:"peers_index,omitempty"`
	// MeshPassword is MeshPasswordFingerprint of the mesh password the
	// agent sends with now, and MeshAccepted of the one it accepts besides
	// during a change of it (the first, when a library gives several);
	// each absent when there is none, and from agents that predate them.
	// The masters never see the passwords. A round of a mesh password
	// change is finished when every live agent reports that round's pair
	// (carve certs check-mesh).
	MeshPassword string `json:"mesh_password,omitempty"`
	MeshAccepted string `json:"mesh_accepted,omitempty"`
}

// meshFingerprintPrefix separates the hash of a mesh password's
// fingerprint from any other use of SHA-256 over it.
const meshFingerprintPrefix = "carve mesh password fingerprint\x00"

// MeshPasswordFingerprint names a mesh password without revealing it: the
// first 8 bytes, hex, of the SHA-256 of a fixed prefix and the password;
// "" for none (nil or empty).
func MeshPasswordFingerprint(password []byte) string {
	if len(password) == 0 {
		return ""
	}
	h := sha256.New()
	h.Write([]byte(meshFingerprintPrefix))
	h.Write(password)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ValidMeshPasswordFingerprint tells whether s is of the form
// MeshPasswordFingerprint gives (16 lowercase hex digits).
func ValidMeshPasswordFingerprint(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
