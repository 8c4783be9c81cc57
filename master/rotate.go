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
	m.signingKey.Store(&key)
	links := 0
	if chain != nil {
		links = len(chain.Links)
	}
	if key != nil {
		m.log.Info("signing records with a new key", "key", api.SigningKeyFingerprint(key.Public().(ed25519.PublicKey)), "chain_links", links)
	}
	return nil
}

// ReloadTLS reads the CA bundle, the certificate and the key again: new
// connections (API, forwarding, Raft) use them; those open stay until they
// close. Without TLS there is nothing to reload. A file that fails to load,
// a certificate that does not verify against the bundle or names another
// master, is refused and what was loaded stays.
func (m *Master) ReloadTLS() error {
	if m.security == nil {
		return nil
	}
	if err := m.security.files.Reload(); err != nil {
		return fmt.Errorf("master: %w", err)
	}
	m.log.Info("reloaded the TLS files", "cert_not_after", m.security.files.NotAfter())
	return nil
}
