package api

import (
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Restore marks a state restored from a snapshot (carve snapshot restore):
// a signed, explicit event that tells an agent to take a state whose index
// may be lower than what it saw, and to refuse the state of a master that
// missed the restore. Agents compare Epoch before the index: a higher epoch
// is a restore to follow, a lower one a stale master.
//
// It is kept apart from the record signing of signing.go: its own type,
// its own domain separator.
//
// RestoreSigningBytes, format version 1:
//
//	"carve-restore-v1" 0x00 str(cluster_id) u64(epoch) u64(index) u64(from)
//
// with str and u64 as in signing.go.
type Restore struct {
	// Epoch orders restores: strictly above the last one the table knew,
	// the restoring leader's clock in Unix nanoseconds when that is higher
	// (a cluster rebuilt from nothing and restored again still moves on).
	Epoch uint64 `json:"epoch"`
	// Index is the Raft index that applied the restore.
	Index uint64 `json:"index"`
	// From is the state index of the snapshot restored.
	From uint64 `json:"from"`
	// Signature is the masters' ed25519 signature of RestoreSigningBytes,
	// standard base64; absent when the masters sign nothing.
	Signature string `json:"signature,omitempty"`
}

const restoreSigningDomain = "carve-restore-v1\x00"

// RestoreSigningBytes is the canonical encoding of a restore that the
// masters sign. It does not read r.Signature.
func RestoreSigningBytes(r Restore, clusterID string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, restoreSigningDomain...)
	b = appendString(b, clusterID)
	b = binary.BigEndian.AppendUint64(b, r.Epoch)
	b = binary.BigEndian.AppendUint64(b, r.Index)
	return binary.BigEndian.AppendUint64(b, r.From)
}

// VerifyRestore checks a restore's signature; the error wraps
// ErrBadSignature.
func VerifyRestore(pub ed25519.PublicKey, r Restore, clusterID string) error {
	if err := verify(pub, RestoreSigningBytes(r, clusterID), r.Signature); err != nil {
		return fmt.Errorf("restore epoch %d at index %d: %w", r.Epoch, r.Index, err)
	}
	return nil
}

// RestoreEpoch is r's epoch, 0 for no restore (nil).
func (r *Restore) RestoreEpoch() uint64 {
	if r == nil {
		return 0
	}
	return r.Epoch
}

// RestoreRequest is POST /cluster/restore: the snapshot that
// GET /cluster/snapshot answered (carve snapshot save), as is.
type RestoreRequest struct {
	Snapshot json.RawMessage `json:"snapshot"`
}
