package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// ErrRevoked: a peer's certificate is on the masters' deny list.
var ErrRevoked = errors.New("certificate revoked")

// Serial is a certificate's serial number as the deny list holds it:
// lowercase hex without separators or leading zeros (api.CanonicalSerial).
func Serial(cert *x509.Certificate) string { return fmt.Sprintf("%x", cert.SerialNumber) }

// ReadCertificate reads the first certificate of a PEM file.
func ReadCertificate(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pki: %s: not a PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	return cert, nil
}

// RefuseRevoked wraps a VerifyConnection hook (nil: none) so that a peer
// whose verified certificate isRevoked fails the handshake, with an error
// wrapping ErrRevoked; refused (when set) is called for each.
func RefuseRevoked(next func(tls.ConnectionState) error, isRevoked func(serial string) bool, refused func()) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 {
			leaf := cs.VerifiedChains[0][0]
			if serial := Serial(leaf); isRevoked(serial) {
				if refused != nil {
					refused()
				}
				return fmt.Errorf("pki: peer %q: %w (serial %s)", leaf.Subject.CommonName, ErrRevoked, serial)
			}
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
}
