package master

// Rotation of what a master holds without a restart: its record-signing
// key and chain (SetSigning) and its TLS files (Reload).

import (
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/carve-net/carve/api"
)

// SetSigning replaces the record-signing key and the chain that endorses
// it (docs/security.md, "Rotation"): every record and tombstone is signed
// with key from now on, and the agents watching learn it at once. With TLS
// a key is required; a chain whose links do not verify is refused and
// nothing changes.
func (m *Master) SetSigning(key ed25519.PrivateKey, chain *api.SigningChain) error {
	if key == nil && m.security != nil {
		return errors.New("master: a signing key is required with TLS")
	}
	if err := m.table.SetSigning(key, chain); err != nil {
		return fmt.Errorf("master: %w", err)
	}
	links := 0
	if chain != nil {
		links = len(chain.Links)
	}
	if key != nil {
		m.log.Info("signing records with a new key", "key", api.SigningKeyFingerprint(key.Public().(ed25519.PublicKey)), "chain_links", links)
	}
	return nil
}
