package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ClaimKeyFile is the agent's claim key in its data dir: the ed25519 key
// it signs its claims on address space with (ring entries, grants), made
// on its host and never sent anywhere; its public half is registered with
// the masters and carried in the agent's signed record.
const ClaimKeyFile = "claim.key"

// LoadOrCreateClaimKey reads the claim key at path (PKCS#8 PEM), making
// it (mode 0600) when there is none. A key file readable by others than
// its owner is refused: anyone who reads it can claim the agent's space.
func LoadOrCreateClaimKey(path string) (ed25519.PrivateKey, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("pki: claim key: %w", err)
		}
		if err := writeKey(path, priv); err != nil {
			return nil, fmt.Errorf("pki: claim key: %w", err)
		}
		return priv, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pki: claim key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("pki: claim key %s has mode %v: want 0600 (chmod 600 %s)", path, st.Mode().Perm(), path)
	}
	priv, err := LoadSigningKey(path) // the same form: PKCS#8 PEM of an ed25519 key
	if err != nil {
		return nil, fmt.Errorf("%w (remove it: the agent makes a new claim key)", err)
	}
	return priv, nil
}
