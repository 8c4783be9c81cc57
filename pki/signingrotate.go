package pki

// Rotation of the masters' record-signing key: a new key pair, and the
// chain link that endorses it with the old key (api.SigningChain).

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
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
	// SignNextKey and SignNextPub are the new key pair until the switch.
	SignNextKey = "signing-next.key"
	SignNextPub = "signing-next.pub"
	// SignPreviousKey and SignPreviousPub keep the replaced key pair from
	// the switch until the rotation is finished.
	SignPreviousKey = "signing-previous.key"
	SignPreviousPub = "signing-previous.pub"
)

// ErrRotation: a step of a signing key rotation out of turn.
var ErrRotation = errors.New("signing key rotation")

// BeginSigningRotation starts a rotation of the record-signing key in dir:
// a new key pair as signing-next.key and .pub, and signing-chain.json with
// the link that endorses it with the current key (signing.key). The
// masters serve the chain first, still signing with the current key; then
// SwitchSigningKey. One rotation at a time.
func BeginSigningRotation(dir string) (api.SigningLink, error) {
	for _, f := range []string{SignNextKey, SignPreviousKey} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return api.SigningLink{}, fmt.Errorf("pki: %w: %s is there: a rotation is under way (finish it first: carve certs rotate-signing --finish)", ErrRotation, filepath.Join(dir, f))
		}
	}
	cur, err := LoadSigningKey(filepath.Join(dir, SignKey))
	if err != nil {
		return api.SigningLink{}, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: signing key: %w", err)
	}
	link := api.NewSigningLink(cur, pub)
	if err := writeSigningKeyPairAs(dir, SignNextKey, SignNextPub, pub, priv); err != nil {
		return api.SigningLink{}, err
	}
	b, err := json.MarshalIndent(&api.SigningChain{Links: []api.SigningLink{link}}, "", "  ")
	if err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: signing chain: %w", err)
	}
	if err := writeNew(filepath.Join(dir, SignChain), append(b, '\n'), 0o644); err != nil {
		return api.SigningLink{}, fmt.Errorf("%w (is a rotation unfinished? carve certs rotate-signing --finish)", err)
	}
	return link, nil
}

// SwitchSigningKey makes the new key of BeginSigningRotation the signing
// key: signing.key and .pub move to signing-previous.*, signing-next.* to
// signing.*. The masters then sign with it, the chain still served.
func SwitchSigningKey(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, SignNextKey)); err != nil {
		return fmt.Errorf("pki: %w: no %s: begin a rotation first (carve certs rotate-signing)", ErrRotation, filepath.Join(dir, SignNextKey))
	}
	for _, mv := range [][2]string{{SignKey, SignPreviousKey}, {SignPub, SignPreviousPub}, {SignNextKey, SignKey}, {SignNextPub, SignPub}} {
		if err := os.Rename(filepath.Join(dir, mv[0]), filepath.Join(dir, mv[1])); err != nil {
			return fmt.Errorf("pki: %w", err)
		}
	}
	return nil
}

// FinishSigningRotation removes the chain and the previous key pair: the
// masters, reloaded, serve the new key alone.
func FinishSigningRotation(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, SignNextKey)); err == nil {
		return fmt.Errorf("pki: %w: %s is there: switch to it first (carve certs rotate-signing --switch)", ErrRotation, filepath.Join(dir, SignNextKey))
	}
	for _, f := range []string{SignChain, SignPreviousKey, SignPreviousPub} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pki: %w", err)
		}
	}
	return nil
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
