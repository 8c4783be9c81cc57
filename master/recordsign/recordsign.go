// Package recordsign signs what the masters publish about agents, with
// the cluster's record-signing key: the records and tombstones of the
// state (api.RecordSigningBytes, api.TombstoneSigningBytes) and the last
// restore (api.RestoreSigningBytes), and it carries the chain that
// endorses the key during a rotation. It signs each content once: it
// keeps, per agent, the last message it signed and its signature, so a
// state read at 10,000 agents after one change signs one record, and a
// registration answer and the next state read share a signature. ed25519
// is deterministic: every master signs a record alike, so their states
// stay byte-identical.
//
// It is a package of its own because signing is a job of its own with
// its own lock and cache, and knows nothing of the lease table: the
// signed bytes are api's, the key pki's. master/state holds a *Signer
// and calls it while it renders; it imports nothing of master/ (see
// cmd/carve/deps_test.go). A nil *Signer signs nothing, so a table
// without a key needs no branch.
package recordsign

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/carve-net/carve/api"
)

// Signer signs records, tombstones and restores with one key, caching
// the signature of each agent's and tombstone's last message. Safe for
// concurrent use; a nil *Signer signs nothing.
type Signer struct {
	key ed25519.PrivateKey
	pub string // api.EncodeSigningKey of the public half
	// chain endorses key during a rotation (nil outside one); chainJSON
	// is its encoding in the state and the changes.
	chain     *api.SigningChain
	chainJSON []byte

	mu         sync.Mutex
	agents     map[string]signedMessage
	tombstones map[string]signedMessage
	signed     atomic.Uint64 // signatures computed (Signatures)
}

type signedMessage struct {
	msg []byte
	sig string
}

// New returns a signer with key that serves chain, which endorses key with
// the keys before it during a rotation (nil outside one). A nil key gives
// a nil signer, which signs nothing. A chain whose links do not verify,
// or a chain without a key, is refused.
func New(key ed25519.PrivateKey, chain *api.SigningChain) (*Signer, error) {
	if key == nil {
		if chain != nil && len(chain.Links) > 0 {
			return nil, errors.New("signing key chain: given without a signing key")
		}
		return nil, nil
	}
	s := &Signer{
		key: key, pub: api.EncodeSigningKey(key.Public().(ed25519.PublicKey)),
		agents: map[string]signedMessage{}, tombstones: map[string]signedMessage{},
	}
	if chain != nil && len(chain.Links) > 0 {
		if err := chain.Verify(); err != nil {
			return nil, fmt.Errorf("signing key chain: %w", err)
		}
		b, err := json.Marshal(chain)
		if err != nil {
			return nil, fmt.Errorf("signing key chain: %w", err)
		}
		s.chain, s.chainJSON = chain, b
	}
	return s, nil
}

// SignAgent sets info.Signature for the cluster clusterID.
func (s *Signer) SignAgent(info *api.AgentInfo, clusterID string) {
	if s == nil {
		return
	}
	info.Signature = s.sign(s.agents, info.AgentID, api.RecordSigningBytes(info, clusterID))
}

// SignTombstone sets t.Signature for the cluster clusterID.
func (s *Signer) SignTombstone(t *api.Tombstone, clusterID string) {
	if s == nil {
		return
	}
	t.Signature = s.sign(s.tombstones, t.AgentID, api.TombstoneSigningBytes(*t, clusterID))
}

// Sign signs msg, uncached (a restore's bytes: one per table); "" for a
// nil signer.
func (s *Signer) Sign(msg []byte) string {
	if s == nil {
		return ""
	}
	return api.Sign(s.key, msg)
}

// sign returns the signature of msg, from the cache when id's last signed
// message was msg. It signs outside the lock: concurrent answers do not
// queue behind one another's signing.
func (s *Signer) sign(cache map[string]signedMessage, id string, msg []byte) string {
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

// Prune forgets the signatures of agents and tombstones that are gone.
func (s *Signer) Prune(agentLive, tombstoneLive func(id string) bool) {
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

// PublicKey is the wire form of the verification key; "" when unsigned.
func (s *Signer) PublicKey() string {
	if s == nil {
		return ""
	}
	return s.pub
}

// SigningChain is the chain the state carries; nil when none.
func (s *Signer) SigningChain() *api.SigningChain {
	if s == nil {
		return nil
	}
	return s.chain
}

// WriteSigningChain appends `,"signing_chain":{...}` during a rotation.
func (s *Signer) WriteSigningChain(out *bytes.Buffer) {
	if s == nil || s.chainJSON == nil {
		return
	}
	out.WriteString(`,"signing_chain":`)
	out.Write(s.chainJSON)
}

// Signatures counts the signatures computed, cached ones not (the tests
// check the caching with it).
func (s *Signer) Signatures() uint64 {
	if s == nil {
		return 0
	}
	return s.signed.Load()
}
