package api

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
)

// Proof of possession of a WireGuard key (issue 26).
//
// A WireGuard public key in a registration is signed into the agent's
// record, and every agent configures it as that agent's peer; WireGuard
// holds one peer per public key, so a host that registered another host's
// key took that host's traffic from every peer. The masters sign a
// WireGuard key only from an agent that proves it holds the private half.
//
// X25519 keys cannot sign, so the proof is a Diffie-Hellman MAC, made
// without a round trip: the masters' X25519 key M is their ed25519
// record-signing key in Montgomery form (the map RFC 7748 section 4.1
// gives, libsodium's crypto_sign_ed25519_pk_to_curve25519), whose private
// half is the clamped first half of SHA-512 of the signing key's seed, the
// scalar ed25519 itself signs with. Every master holds that key, and every
// agent knows its public half (State.SigningKey). The agent computes
//
//	shared = X25519(wireguard private key, M)
//	proof  = HMAC-SHA256(shared, "carve-wg-possession-v1" 0x00 str(agent id) str(wireguard public key))
//
// with str as in RecordSigningBytes and the public key in its wire form
// (standard base64); a master computes shared as X25519(m, wireguard
// public key). Only the holders of the WireGuard private key and of the
// signing key can compute it; it is bound to the agent id, so another
// agent cannot replay it. The masters' answer to a proof is a yes or no
// (never the shared value), and X25519 is safe with any peer key, so
// proving against a key that is not the masters' reveals nothing.
//
// A proof names the signing key it was made against (WireGuardProof.SigningKey):
// during a rotation of that key, masters sign with the old or the new one,
// and an agent sends a proof for each key it knows; a master that finds
// none for its own key answers 403 CodeWireGuardProof with its key in
// Error.SigningKey.

// wireGuardProofDomain separates a proof's message from every signed message.
const wireGuardProofDomain = "carve-wg-possession-v1\x00"

// MaxWireGuardProofs bounds RegisterRequest.WireGuardProofs: the current
// signing key and the ones before and after it during a rotation.
const MaxWireGuardProofs = 4

// CodeWireGuardProof (HTTP 403): an agent registered a WireGuard key
// without a proof that verifies against the refusing master's signing key
// (Error.SigningKey): make one against that key, or upgrade the agent.
const CodeWireGuardProof = "wireguard_proof"

// ErrWireGuardProof marks a proof of possession that is malformed or does
// not verify.
var ErrWireGuardProof = errors.New("bad wireguard proof of possession")

// WireGuardProof proves that the registering agent holds the private half
// of RegisterRequest.Keys.WireGuard.
type WireGuardProof struct {
	// SigningKey is the masters' record-signing public key (wire form,
	// EncodeSigningKey) the proof was made against.
	SigningKey string `json:"signing_key"`
	// MAC is the proof, standard base64 of 32 bytes.
	MAC string `json:"mac"`
}

// WireGuardProofBytes is the message a proof authenticates.
func WireGuardProofBytes(agentID, wgPublic string) []byte {
	b := make([]byte, 0, len(wireGuardProofDomain)+8+len(agentID)+len(wgPublic))
	b = append(b, wireGuardProofDomain...)
	b = appendString(b, agentID)
	return appendString(b, wgPublic)
}

// ProveWireGuardKey proves that agentID holds wgPrivate (a WireGuard
// private key) to the masters that sign with signing.
func ProveWireGuardKey(wgPrivate [32]byte, agentID string, signing ed25519.PublicKey) (WireGuardProof, error) {
	priv, err := ecdh.X25519().NewPrivateKey(wgPrivate[:])
	if err != nil {
		return WireGuardProof{}, fmt.Errorf("%w: wireguard private key: %w", ErrWireGuardProof, err)
	}
	m, err := signingKeyX25519(signing)
	if err != nil {
		return WireGuardProof{}, err
	}
	shared, err := priv.ECDH(m)
	if err != nil {
		return WireGuardProof{}, fmt.Errorf("%w: signing key %s: %w", ErrWireGuardProof, SigningKeyFingerprint(signing), err)
	}
	wgPublic := base64.StdEncoding.EncodeToString(priv.PublicKey().Bytes())
	return WireGuardProof{SigningKey: EncodeSigningKey(signing), MAC: proofMAC(shared, agentID, wgPublic)}, nil
}

// VerifyWireGuardProof checks, for the master that signs with signing,
// that p proves agentID holds the private half of wgPublic (wire form). p
// must be made against signing's public key; the error wraps
// ErrWireGuardProof.
func VerifyWireGuardProof(signing ed25519.PrivateKey, agentID, wgPublic string, p WireGuardProof) error {
	if len(signing) != ed25519.PrivateKeySize {
		return fmt.Errorf("%w: no signing key", ErrWireGuardProof)
	}
	if own := EncodeSigningKey(signing.Public().(ed25519.PublicKey)); p.SigningKey != own {
		return fmt.Errorf("%w: made against signing key %s, not %s", ErrWireGuardProof, p.SigningKey, own)
	}
	raw, err := base64.StdEncoding.DecodeString(wgPublic)
	if err != nil {
		return fmt.Errorf("%w: keys.wireguard %q: %w", ErrWireGuardProof, wgPublic, err)
	}
	pub, err := ecdh.X25519().NewPublicKey(raw)
	if err != nil {
		return fmt.Errorf("%w: keys.wireguard %q: %w", ErrWireGuardProof, wgPublic, err)
	}
	h := sha512.Sum512(signing.Seed())
	m, err := ecdh.X25519().NewPrivateKey(h[:32]) // clamped by X25519 as by ed25519
	if err != nil {
		return fmt.Errorf("%w: %w", ErrWireGuardProof, err)
	}
	shared, err := m.ECDH(pub)
	if err != nil {
		// A low-order point: nobody holds a private key for it.
		return fmt.Errorf("%w: keys.wireguard %q is not a usable public key: %w", ErrWireGuardProof, wgPublic, err)
	}
	got, err := base64.StdEncoding.DecodeString(p.MAC)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: mac: want standard base64 of %d bytes", ErrWireGuardProof, sha256.Size)
	}
	want, _ := base64.StdEncoding.DecodeString(proofMAC(shared, agentID, wgPublic))
	if !hmac.Equal(got, want) {
		return fmt.Errorf("%w: it does not verify for agent %q and wireguard key %s", ErrWireGuardProof, agentID, wgPublic)
	}
	return nil
}

// ValidateWireGuardProofs checks the form of a registration's proofs (at
// most MaxWireGuardProofs, each a signing key and a MAC of the right
// sizes); the error names the field.
func ValidateWireGuardProofs(ps []WireGuardProof) error {
	if len(ps) > MaxWireGuardProofs {
		return fmt.Errorf("wireguard_proofs: %d proofs, at most %d (one per signing key the agent knows)", len(ps), MaxWireGuardProofs)
	}
	for i, p := range ps {
		if _, err := ParseSigningKey(p.SigningKey); err != nil {
			return fmt.Errorf("wireguard_proofs[%d].%w", i, err)
		}
		if b, err := base64.StdEncoding.DecodeString(p.MAC); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("wireguard_proofs[%d].mac: want standard base64 of %d bytes", i, sha256.Size)
		}
	}
	return nil
}

func proofMAC(shared []byte, agentID, wgPublic string) string {
	mac := hmac.New(sha256.New, shared)
	mac.Write(WireGuardProofBytes(agentID, wgPublic))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// fieldP is 2^255 - 19, the field of Curve25519 and edwards25519.
var fieldP = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))

// signingKeyX25519 is the Montgomery form of an ed25519 public key: u =
// (1 + y) / (1 - y) mod p, y its Edwards coordinate (RFC 7748, 4.1).
func signingKeyX25519(signing ed25519.PublicKey) (*ecdh.PublicKey, error) {
	if len(signing) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: signing key of %d bytes", ErrWireGuardProof, len(signing))
	}
	le := [32]byte(signing)
	le[31] &= 0x7f // the sign of x
	y := new(big.Int).SetBytes(reverse(le[:]))
	one := big.NewInt(1)
	den := new(big.Int).Sub(one, y)
	den.Mod(den, fieldP)
	if y.Cmp(fieldP) >= 0 || den.Sign() == 0 {
		return nil, fmt.Errorf("%w: signing key %s is not a usable ed25519 public key", ErrWireGuardProof, SigningKeyFingerprint(signing))
	}
	u := new(big.Int).Add(one, y)
	u.Mul(u, den.ModInverse(den, fieldP))
	u.Mod(u, fieldP)
	var out [32]byte
	u.FillBytes(out[:])
	pub, err := ecdh.X25519().NewPublicKey(reverse(out[:]))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrWireGuardProof, err)
	}
	return pub, nil
}

// reverse reverses b in place (little- and big-endian) and returns it.
func reverse(b []byte) []byte {
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return b
}
