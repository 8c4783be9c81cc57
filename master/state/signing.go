package state

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/carve-net/carve/api"
)

// recordSigner signs the records and tombstones the masters publish with
// the cluster's record-signing key (api.RecordSigningBytes). It signs each
// content once: it keeps, per agent, the last message it signed and its
// signature, so a state read at 10,000 agents after one change signs one
// record, and a registration answer and the next state read share a
// signature. ed25519 is deterministic: every master signs a record alike,
// so their states stay byte-identical.
type recordSigner struct {
	key ed25519.PrivateKey
	pub string // api.EncodeSigningKey of the public half
	// chain endorses key during a rotation (nil outside one); chainJSON
	// is its encoding in the state and the changes.
	chain     *api.SigningChain
	chainJSON []byte

	mu         sync.Mutex
	agents     map[string]signedMessage
	tombstones map[string]signedMessage
	signed     atomic.Uint64 // signatures computed (tests check the caching)
}

type signedMessage struct {
	msg []byte
	sig string
}

func newRecordSigner(key ed25519.PrivateKey) *recordSigner {
	return &recordSigner{
		key: key, pub: api.EncodeSigningKey(key.Public().(ed25519.PublicKey)),
		agents: map[string]signedMessage{}, tombstones: map[string]signedMessage{},
	}
}

// signAgent sets info.Signature; a nil signer signs nothing.
func (s *recordSigner) signAgent(info *api.AgentInfo, clusterID string) {
	if s == nil {
		return
	}
	info.Signature = s.sign(s.agents, info.AgentID, api.RecordSigningBytes(info, clusterID))
}

// signTombstone sets t.Signature; a nil signer signs nothing.
func (s *recordSigner) signTombstone(t *api.Tombstone, clusterID string) {
	if s == nil {
		return
	}
	t.Signature = s.sign(s.tombstones, t.AgentID, api.TombstoneSigningBytes(*t, clusterID))
}

// sign returns the signature of msg, from the cache when id's last signed
// message was msg. It signs outside the lock: concurrent answers do not
// queue behind one another's signing.
func (s *recordSigner) sign(cache map[string]signedMessage, id string, msg []byte) string {
	s.mu.Lock()
	c, ok := cache[id]
	s.mu.Unlock()
	if ok && bytes.Equal(c.msg, msg) {
		return c.sig
	}
	sig := api.Sign(s.key, msg)
	s.signed.Add(1)
	s.mu.Lock()
	cache[id] = signedMessage{msg: msg, sig: sig}
	s.mu.Unlock()
	return sig
}

// prune forgets the signatures of agents and tombstones that are gone.
func (s *recordSigner) prune(agentLive, tombstoneLive func(id string) bool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.agents {
		if !agentLive(id) {
			delete(s.agents, id)
		}
	}
	for id := range s.tombstones {
		if !tombstoneLive(id) {
			delete(s.tombstones, id)
		}
	}
}

// publicKey is the wire form of the verification key; "" when unsigned.
func (s *recordSigner) publicKey() string {
	if s == nil {
		return ""
	}
	return s.pub
}

// signingChain is the chain the state carries; nil when none.
func (s *recordSigner) signingChain() *api.SigningChain {
	if s == nil {
		return nil
	}
	return s.chain
}

// writeSigningChain appends `,"signing_chain":{...}` during a rotation.
func (s *recordSigner) writeSigningChain(out *bytes.Buffer) {
	if s == nil || s.chainJSON == nil {
		return
	}
	out.WriteString(`,"signing_chain":`)
	out.Write(s.chainJSON)
}

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
	var signer *recordSigner
	if key != nil {
		signer = newRecordSigner(key)
		if chain != nil && len(chain.Links) > 0 {
			if err := chain.Verify(); err != nil {
				return fmt.Errorf("signing key chain: %w", err)
			}
			b, err := json.Marshal(chain)
			if err != nil {
				return fmt.Errorf("signing key chain: %w", err)
			}
			signer.chain, signer.chainJSON = chain, b
		}
	} else if chain != nil && len(chain.Links) > 0 {
		return fmt.Errorf("signing key chain: given without a signing key")
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
	signer.signAgent(info, clusterID)
}
