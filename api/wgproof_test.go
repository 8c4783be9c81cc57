package api

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// testWGKey is a WireGuard key pair made from r: the private half and the
// public half's wire form.
func testWGKey(t *testing.T, r *rand.Rand) ([32]byte, string) {
	t.Helper()
	var priv [32]byte
	for i := range priv {
		priv[i] = byte(r.IntN(256))
	}
	k, err := ecdh.X25519().NewPrivateKey(priv[:])
	if err != nil {
		t.Fatal(err)
	}
	return priv, base64.StdEncoding.EncodeToString(k.PublicKey().Bytes())
}

// testSigningKey is an ed25519 key made from r.
func testSigningKey(r *rand.Rand) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(r.IntN(256))
	}
	return ed25519.NewKeyFromSeed(seed)
}

// The Montgomery form of a signing key is the X25519 public key of the
// scalar ed25519 signs with, for any key: what makes the masters' half of
// the proof theirs alone.
func TestSigningKeyX25519MatchesTheSigningScalar(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	for range 200 {
		key := testSigningKey(r)
		m, err := signingKeyX25519(key.Public().(ed25519.PublicKey))
		if err != nil {
			t.Fatal(err)
		}
		h := sha512.Sum512(key.Seed())
		priv, err := ecdh.X25519().NewPrivateKey(h[:32])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Bytes(), priv.PublicKey().Bytes()) {
			t.Fatalf("signing key %s: Montgomery form %x, X25519 of its scalar %x", SigningKeyFingerprint(key.Public().(ed25519.PublicKey)), m.Bytes(), priv.PublicKey().Bytes())
		}
	}
}

// A proof verifies for the agent, the WireGuard key and the signing key it
// was made for, and for no other.
func TestWireGuardProof(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 1))
	signing, other := testSigningKey(r), testSigningKey(r)
	wgPriv, wgPub := testWGKey(t, r)
	_, victimPub := testWGKey(t, r)
	proof, err := ProveWireGuardKey(wgPriv, "h1", signing.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateWireGuardProofs([]WireGuardProof{proof}); err != nil {
		t.Fatalf("a proof made here: %v", err)
	}
	otherProof, err := ProveWireGuardKey(wgPriv, "h1", other.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	tampered := proof
	mac, _ := base64.StdEncoding.DecodeString(proof.MAC)
	mac[0] ^= 1
	tampered.MAC = base64.StdEncoding.EncodeToString(mac)
	lowOrder := base64.StdEncoding.EncodeToString(make([]byte, 32))
	tests := []struct {
		name     string
		signing  ed25519.PrivateKey
		agent    string
		wgPublic string
		proof    WireGuardProof
		mention  string // "": verifies
	}{
		{"its own", signing, "h1", wgPub, proof, ""},
		{"made against the other signing key, verified by its holder", other, "h1", wgPub, otherProof, ""},
		{"another agent replays it", signing, "h2", wgPub, proof, `agent "h2"`},
		{"another host's key with this proof", signing, "h1", victimPub, proof, victimPub},
		{"made against another signing key", signing, "h1", wgPub, otherProof, "made against signing key"},
		{"a changed mac", signing, "h1", wgPub, tampered, "does not verify"},
		{"a mac that is not base64", signing, "h1", wgPub, WireGuardProof{SigningKey: proof.SigningKey, MAC: "!"}, "mac"},
		{"a low-order key", signing, "h1", lowOrder, WireGuardProof{SigningKey: proof.SigningKey, MAC: proof.MAC}, "not a usable public key"},
		{"a key that is not base64", signing, "h1", "!", proof, "keys.wireguard"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyWireGuardProof(tt.signing, tt.agent, tt.wgPublic, tt.proof)
			if tt.mention == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrWireGuardProof) || !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("err %v, want ErrWireGuardProof mentioning %q", err, tt.mention)
			}
		})
	}
}

// ValidateWireGuardProofs names what is malformed.
func TestValidateWireGuardProofs(t *testing.T) {
	key := EncodeSigningKey(make([]byte, ed25519.PublicKeySize))
	mac := base64.StdEncoding.EncodeToString(make([]byte, 32))
	good := WireGuardProof{SigningKey: key, MAC: mac}
	tests := []struct {
		name    string
		proofs  []WireGuardProof
		mention string
	}{
		{"none", nil, ""},
		{"one", []WireGuardProof{good}, ""},
		{"the most", []WireGuardProof{good, good, good, good}, ""},
		{"too many", []WireGuardProof{good, good, good, good, good}, "at most 4"},
		{"bad signing key", []WireGuardProof{good, {SigningKey: "x", MAC: mac}}, "wireguard_proofs[1].signing_key"},
		{"short mac", []WireGuardProof{{SigningKey: key, MAC: "AAAA"}}, "wireguard_proofs[0].mac"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateWireGuardProofs(tt.proofs)
			if (err == nil) != (tt.mention == "") || err != nil && !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("err %v, want one mentioning %q", err, tt.mention)
			}
		})
	}
}

// What a registration carries never panics the masters' check.
func FuzzVerifyWireGuardProof(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	signing := testSigningKey(r)
	var wgPriv [32]byte
	wgPriv[0] = 7
	k, _ := ecdh.X25519().NewPrivateKey(wgPriv[:])
	wgPub := base64.StdEncoding.EncodeToString(k.PublicKey().Bytes())
	proof, err := ProveWireGuardKey(wgPriv, "h1", signing.Public().(ed25519.PublicKey))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("h1", wgPub, proof.SigningKey, proof.MAC)
	f.Add("h2", wgPub, proof.SigningKey, proof.MAC)
	f.Add("h1", base64.StdEncoding.EncodeToString(make([]byte, 32)), proof.SigningKey, proof.MAC)
	f.Add("", "", "", "")
	f.Add("h1", "====", "AAAA", "!!!!")
	f.Fuzz(func(t *testing.T, agent, wgPublic, signingKey, mac string) {
		p := WireGuardProof{SigningKey: signingKey, MAC: mac}
		_ = ValidateWireGuardProofs([]WireGuardProof{p})
		err := VerifyWireGuardProof(signing, agent, wgPublic, p)
		if err == nil && (agent != "h1" || wgPublic != wgPub) {
			t.Fatalf("a proof for agent %q key %s verified", agent, wgPublic)
		}
	})
}
