package state

import (
	"crypto/ed25519"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/recordsign"
)

// SetSigningKey makes the table sign every record and tombstone it renders
// for the API with key (nil: sign nothing). Call it before serving.
func (t *LeaseTable) SetSigningKey(key ed25519.PrivateKey) {
	// Without a chain nothing can fail.
	_ = t.SetSigning(key, nil)
}

// SetSigning makes the table sign with key and serve chain, which endorses
// key with the keys before it during a rotation (nil outside one). It may
// be called while serving (a master reloads its key on SIGHUP): the
// watchers wake, so agents learn the new key at once. A chain with a link
// that does not verify is refused, and nothing changes.
func (t *LeaseTable) SetSigning(key ed25519.PrivateKey, chain *api.SigningChain) error {
	signer, err := recordsign.New(key, chain)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.signer = signer
	t.signingGen++
	// Cached encodings carry the signatures of the previous key.
	t.cache.mu.Lock()
	t.cache.invalidate()
	t.cache.mu.Unlock()
	t.notifyChanged()
	return nil
}

// SigningGeneration counts the calls of SetSigning: a watcher waiting for
// the next change also returns when the signing key or chain changed.
func (t *LeaseTable) SigningGeneration() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.signingGen
}

// SignAgent signs a record rendered for an answer (a registration, GET
// agent) as the state shows it.
func (t *LeaseTable) SignAgent(info *api.AgentInfo) {
	t.mu.RLock()
	signer, clusterID := t.signer, t.clusterID
	t.mu.RUnlock()
	signer.SignAgent(info, clusterID)
}
