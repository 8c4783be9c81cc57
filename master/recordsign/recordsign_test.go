package recordsign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

func testKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("recordsign test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

// TestNew: no key signs nothing; a chain needs a key and must verify; a
// chain that does is served as the state carries it.
func TestNew(t *testing.T) {
	old, next := testKey("old"), testKey("next")
	good := &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(old, next.Public().(ed25519.PublicKey))}}
	forged := &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(testKey("mallory"), next.Public().(ed25519.PublicKey))}}
	forged.Links[0].Previous = good.Links[0].Previous
	tests := []struct {
		name    string
		key     ed25519.PrivateKey
		chain   *api.SigningChain
		wantErr string // "" for none
		wantNil bool
	}{
		{"no key", nil, nil, "", true},
		{"no key, empty chain", nil, &api.SigningChain{}, "", true},
		{"chain without key", nil, good, "given without a signing key", true},
		{"key", next, nil, "", false},
		{"key and chain", next, good, "", false},
		{"forged chain", next, forged, "signing key chain", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.key, tt.chain)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
			if (s == nil) != tt.wantNil {
				t.Fatalf("signer %v, want nil %v", s, tt.wantNil)
			}
			if s == nil {
				return
			}
			if s.PublicKey() != api.EncodeSigningKey(tt.key.Public().(ed25519.PublicKey)) {
				t.Errorf("public key %s", s.PublicKey())
			}
			var out bytes.Buffer
			s.WriteSigningChain(&out)
			if (tt.chain == nil) != (out.Len() == 0) || (tt.chain == nil) != (s.SigningChain() == nil) {
				t.Errorf("chain %+v written as %q", s.SigningChain(), out.String())
			}
			if tt.chain != nil && !strings.HasPrefix(out.String(), `,"signing_chain":{`) {
				t.Errorf("chain written as %q", out.String())
			}
		})
	}
}

// TestSignsEachContentOnce: a record or tombstone is signed once per
// content, the signature verifies, and two signers with one key sign
// alike (every master's state is byte-identical); pruned entries are
// signed again.
func TestSignsEachContentOnce(t *testing.T) {
	key := testKey("k")
	pub := key.Public().(ed25519.PublicKey)
	s, _ := New(key, nil)
	other, _ := New(key, nil)
	info := &api.AgentInfo{AgentID: "a1", IP: "198.18.0.1", Version: 3}
	tomb := api.Tombstone{AgentID: "a2", Version: 4}
	steps := []struct {
		name  string
		do    func()
		signs uint64
	}{
		{"first record", func() { s.SignAgent(info, "c1") }, 1},
		{"same record", func() { s.SignAgent(info, "c1") }, 0},
		{"other cluster id", func() { s.SignAgent(info, "c2") }, 1},
		{"changed record", func() { info.Version = 5; s.SignAgent(info, "c2") }, 1},
		{"tombstone", func() { s.SignTombstone(&tomb, "c2") }, 1},
		{"same tombstone", func() { s.SignTombstone(&tomb, "c2") }, 0},
		{"pruned record", func() {
			s.Prune(func(string) bool { return false }, func(string) bool { return true })
			s.SignAgent(info, "c2")
		}, 1},
		{"kept tombstone", func() { s.SignTombstone(&tomb, "c2") }, 0},
	}
	for _, st := range steps {
		before := s.Signatures()
		st.do()
		if got := s.Signatures() - before; got != st.signs {
			t.Errorf("%s: %d signatures, want %d", st.name, got, st.signs)
		}
	}
	if err := api.VerifyRecord(pub, info, "c2"); err != nil {
		t.Errorf("record signature: %v", err)
	}
	if err := api.VerifyTombstone(pub, tomb, "c2"); err != nil {
		t.Errorf("tombstone signature: %v", err)
	}
	again := *info
	other.SignAgent(&again, "c2")
	if again.Signature != info.Signature {
		t.Errorf("two signers with one key signed differently: %s and %s", again.Signature, info.Signature)
	}
	if msg := []byte("restore"); s.Sign(msg) != api.Sign(key, msg) {
		t.Error("Sign is not api.Sign with the key")
	}
}

// TestNilSigner: a nil signer signs and writes nothing.
func TestNilSigner(t *testing.T) {
	var s *Signer
	info := &api.AgentInfo{AgentID: "a1"}
	tomb := api.Tombstone{AgentID: "a2"}
	s.SignAgent(info, "c1")
	s.SignTombstone(&tomb, "c1")
	s.Prune(nil, nil)
	var out bytes.Buffer
	s.WriteSigningChain(&out)
	if info.Signature != "" || tomb.Signature != "" || out.Len() > 0 || s.PublicKey() != "" || s.SigningChain() != nil || s.Sign([]byte("x")) != "" || s.Signatures() != 0 {
		t.Error("a nil signer signed or wrote something")
	}
}
