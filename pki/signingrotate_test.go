package pki

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestSigningRotationSteps walks begin, switch and finish, and refuses
// each step out of turn.
func TestSigningRotationSteps(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, 0); err != nil {
		t.Fatal(err)
	}
	old, err := LoadVerifyKey(filepath.Join(dir, SignPub))
	if err != nil {
		t.Fatal(err)
	}
	if err := SwitchSigningKey(dir); !errors.Is(err, ErrRotation) {
		t.Errorf("switch before begin: %v, want ErrRotation", err)
	}
	link, err := BeginSigningRotation(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := BeginSigningRotation(dir); !errors.Is(err, ErrRotation) {
		t.Errorf("a second begin: %v, want ErrRotation", err)
	}
	if err := FinishSigningRotation(dir); !errors.Is(err, ErrRotation) {
		t.Errorf("finish before switch: %v, want ErrRotation", err)
	}
	chain, err := LoadSigningChain(filepath.Join(dir, SignChain))
	if err != nil {
		t.Fatal(err)
	}
	next, err := LoadVerifyKey(filepath.Join(dir, SignNextPub))
	if err != nil {
		t.Fatal(err)
	}
	if !chain.Reaches(old, next) || link.Key != api.EncodeSigningKey(next) {
		t.Fatalf("the chain %+v does not lead from the current key to the next", chain)
	}
	if err := SwitchSigningKey(dir); err != nil {
		t.Fatal(err)
	}
	cur, err := LoadSigningKey(filepath.Join(dir, SignKey))
	if err != nil {
		t.Fatal(err)
	}
	if !next.Equal(cur.Public()) {
		t.Error("signing.key is not the new key after the switch")
	}
	if err := FinishSigningRotation(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{SignChain, SignPreviousKey, SignPreviousPub, SignNextKey} {
		if _, err := LoadSigningChain(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s is still there", f)
		}
	}
	// A chain file with a link that does not verify is refused.
	link.Signature = api.Sign(cur, []byte("something else"))
	if err := (&api.SigningChain{Links: []api.SigningLink{link}}).Verify(); !errors.Is(err, api.ErrSigningChain) {
		t.Errorf("a forged link: %v, want ErrSigningChain", err)
	}
}
