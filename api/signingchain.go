package api

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// The record-signing key chain.
//
// The masters' record-signing key is replaced without restarting an
// agent: the masters serve, beside the new key (State.SigningKey), links
// that endorse each new key with the key before it. An agent that trusts
// key A (pinned on first use, or --signing-pub-file) takes key B only
// when the chain leads from A to B, each link signed by its previous key;
// a master state with another key is refused, whatever its cluster id.
// While the chain is served, records signed by a key the chain leads from
// (the previous keys) still verify, so masters may switch one by one; once
// the operator drops the chain, only the current key verifies.
//
// SigningLinkBytes, format version 1:
//
//	"carve-signing-link-v1" 0x00 str(previous) str(key)
//
// with str as in RecordSigningBytes, and the keys in their wire form
// (EncodeSigningKey). The link carries no cluster id: it endorses a key,
// whichever cluster the masters serve.

// signingLinkDomain separates a link's bytes from a record's or a tombstone's.
const signingLinkDomain = "carve-signing-link-v1\x00"

// ErrSigningChain marks a chain link that is malformed or does not verify.
var ErrSigningChain = errors.New("bad signing key chain")

// SigningChain is the masters' record-signing key history during a
// rotation (State.SigningChain, Changes.SigningChain): each link endorses
// a key with the one before it. Empty outside a rotation.
type SigningChain struct {
	Links []SigningLink `json:"links,omitempty"`
}

// SigningLink endorses Key (the new record-signing key) with Previous: the
// Signature is Previous's over SigningLinkBytes. Keys are in their wire
// form (EncodeSigningKey).
type SigningLink struct {
	Previous  string `json:"previous"`
	Key       string `json:"key"`
	Signature string `json:"signature"`
}

// SigningLinkBytes is the canonical encoding a link's previous key signs.
func SigningLinkBytes(previous, key string) []byte {
	b := make([]byte, 0, len(signingLinkDomain)+8+len(previous)+len(key))
	b = append(b, signingLinkDomain...)
	b = appendString(b, previous)
	return appendString(b, key)
}

// NewSigningLink endorses next with previous.
func NewSigningLink(previous ed25519.PrivateKey, next ed25519.PublicKey) SigningLink {
	prev := EncodeSigningKey(previous.Public().(ed25519.PublicKey))
	key := EncodeSigningKey(next)
	return SigningLink{Previous: prev, Key: key, Signature: Sign(previous, SigningLinkBytes(prev, key))}
}

// Verify checks a link's keys and signature; the error wraps
// ErrSigningChain.
func (l SigningLink) Verify() error {
	prev, err := ParseSigningKey(l.Previous)
	if err != nil {
		return fmt.Errorf("%w: previous: %w", ErrSigningChain, err)
	}
	if _, err := ParseSigningKey(l.Key); err != nil {
		return fmt.Errorf("%w: key: %w", ErrSigningChain, err)
	}
	if err := verify(prev, SigningLinkBytes(l.Previous, l.Key), l.Signature); err != nil {
		return fmt.Errorf("%w: link to %s: %w", ErrSigningChain, l.Key, err)
	}
	return nil
}

// Verify checks every link: the masters refuse a chain file with a link
// that does not verify.
func (c *SigningChain) Verify() error {
	if c == nil {
		return nil
	}
	for i, l := range c.Links {
		if err := l.Verify(); err != nil {
			return fmt.Errorf("link %d: %w", i, err)
		}
	}
	return nil
}

// Reaches tells whether the chain leads from key from to key to through
// links that verify (from == to: true). Links that do not verify are
// skipped: a master never serves them, and an agent never follows them.
// Every path is searched: in a forked chain, a link that leads to a dead
// end does not hide another that leads to to.
func (c *SigningChain) Reaches(from, to ed25519.PublicKey) bool {
	if from.Equal(to) {
		return true
	}
	target := EncodeSigningKey(to)
	return c.walk(EncodeSigningKey(from), true, func(key string) bool { return key == target })
}

// Previous is the keys the chain leads from to key, nearest first: those
// whose records still verify while the masters serve the chain. Every path
// back is searched, as in Reaches.
func (c *SigningChain) Previous(key ed25519.PublicKey) []ed25519.PublicKey {
	var out []ed25519.PublicKey
	c.walk(EncodeSigningKey(key), false, func(prev string) bool {
		k, _ := ParseSigningKey(prev) // the link verified
		out = append(out, k)
		return false
	})
	return out
}

// walk visits, breadth first (nearest first) and each once, the keys the
// chain's verifying links lead to from start: forward from a link's
// Previous to its Key, else back. It stops at the first key visit returns
// true for, and tells whether there was one.
func (c *SigningChain) walk(start string, forward bool, visit func(key string) bool) bool {
	if c == nil {
		return false
	}
	seen := map[string]bool{start: true}
	queue := []string{start}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, l := range c.Links {
			from, to := l.Previous, l.Key
			if !forward {
				from, to = to, from
			}
			if from != cur || seen[to] || l.Verify() != nil {
				continue
			}
			if visit(to) {
				return true
			}
			seen[to] = true
			queue = append(queue, to)
		}
	}
	return false
}

// SigningKeyFingerprint names a public record-signing key in logs and
// errors: "sha256:" and the hex of the first 8 bytes of its SHA-256.
func SigningKeyFingerprint(k ed25519.PublicKey) string {
	sum := sha256.Sum256(k)
	return "sha256:" + hex.EncodeToString(sum[:8])
}
