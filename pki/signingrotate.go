package pki

// Rotation of the masters' record-signing key: a new key pair, and the
// chain link that endorses it with the old key (api.SigningChain).

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/carve-net/carve/api"
)

// Files of a record-signing key rotation, beside signing.key.
const (
	// SignChain holds the chain the masters serve during the rotation
	// (their --signing-chain-file).
	SignChain = "signing-chain.json"
	// SignPreviousKey and SignPreviousPub keep the replaced key pair until
	// the rotation is finished.
	SignPreviousKey = "signing-previous.key"
	SignPreviousPub = "signing-previous.pub"
)

// RotateSigningKey replaces the record-signing key pair in dir: the old
// one is kept as signing-previous.key and .pub, a new one is written as
// signing.key and .pub, and signing-chain.json gets the link that
// endorses the new key with the old one. One rotation at a time: while
// signing-previous.key is there, it refuses with an error wrapping
// ErrExists.
func RotateSigningKey(dir string) (api.SigningLink, error) {
	prevKey, prevPub := filepath.Join(dir, SignPreviousKey), filepath.Join(dir, SignPreviousPub)
	for _, f := range []string{prevKey, prevPub} {
		if _, err := os.Stat(f); err == nil {
			return api.SigningLink{}, fmt.Errorf("pki: %s: %w (a rotation is under way: finish it first, removing %s, %s and %s once every master signs with the new key and every agent follows it)",
				f, ErrExists, SignPreviousKey, SignPreviousPub, SignChain)
		}
	}
	old, err := LoadSigningKey(filepath.Join(dir, SignKey))
	if err != nil {
		return api.SigningLink{}, err
	}
	chainPath := filepath.Join(dir, SignChain)
	chain := &api.SigningChain{}
	if _, err := os.Stat(chainPath); err == nil {
		if chain, err = LoadSigningChain(chainPath); err != nil {
			return api.SigningLink{}, err
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: signing key: %w", err)
	}
	link := api.NewSigningLink(old, pub)
	chain.Links = append(chain.Links, link)
	// The old pair moves aside first: a failure after it leaves no
	// signing.key, which the next attempt names, rather than a mix.
	if err := os.Rename(filepath.Join(dir, SignKey), prevKey); err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: %w", err)
	}
	if err := os.Rename(filepath.Join(dir, SignPub), prevPub); err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: %w", err)
	}
	if err := writeSigningKeyPair(dir, pub, priv); err != nil {
		return api.SigningLink{}, err
	}
	b, err := json.MarshalIndent(chain, "", "  ")
	if err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: signing chain: %w", err)
	}
	tmp := chainPath + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: %w", err)
	}
	if err := os.Rename(tmp, chainPath); err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: %w", err)
	}
	return link, nil
}

// LoadSigningChain reads a chain file (signing-chain.json) and checks
// every link.
func LoadSigningChain(path string) (*api.SigningChain, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	var chain api.SigningChain
	if err := json.Unmarshal(b, &chain); err != nil {
		return nil, fmt.Errorf("pki: %s: not a signing key chain (carve certs rotate-signing writes one): %w", path, err)
	}
	if len(chain.Links) == 0 {
		return nil, fmt.Errorf("pki: %s: %w: no links", path, api.ErrSigningChain)
	}
	if err := chain.Verify(); err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	return &chain, nil
}
