package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// writeSigningKey writes the masters' record-signing key pair into dir.
func writeSigningKey(dir string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: signing key: %w", err)
	}
	return writeSigningKeyPair(dir, pub, priv)
}

// writeSigningKeyPair writes signing.key and signing.pub into dir.
func writeSigningKeyPair(dir string, pub ed25519.PublicKey, priv ed25519.PrivateKey) error {
	return writeSigningKeyPairAs(dir, SignKey, SignPub, pub, priv)
}

// writeSigningKeyPairAs writes a record-signing key pair into dir under
// the names given.
func writeSigningKeyPairAs(dir, keyName, pubName string, pub ed25519.PublicKey, priv ed25519.PrivateKey) error {
	if err := writeKey(filepath.Join(dir, keyName), priv); err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("pki: signing key: %w", err)
	}
	return writePEM(filepath.Join(dir, pubName), "PUBLIC KEY", der, 0o644)
}

// LoadSigningKey reads the masters' ed25519 record-signing key.
func LoadSigningKey(path string) (ed25519.PrivateKey, error) {
	k, err := readPrivateKey(path)
	if err != nil {
		return nil, err
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: %s: not an ed25519 key", path)
	}
	return priv, nil
}

// LoadVerifyKey reads the public half of the record-signing key.
func LoadVerifyKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return ParseVerifyKey(b)
}

// ParseVerifyKey decodes a PEM ("PUBLIC KEY", PKIX) ed25519 public key.
func ParseVerifyKey(pemBytes []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("pki: not a PEM public key")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("pki: public key is not ed25519")
	}
	return pub, nil
}

// EncodeVerifyKey is the PEM form of a public key (what ParseVerifyKey reads).
func EncodeVerifyKey(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}
