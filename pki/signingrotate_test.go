package pki

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
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

// errCrash stops a switch as a crash would.
var errCrash = errors.New("crash")

// TestSwitchSigningKeyRerunAfterCrash stops the switch after each of its
// steps (and in the states an older carve's switch by four renames left),
// reruns it, and checks the end state: signing.key and .pub the new key,
// signing-previous.key and .pub the old one, no signing-next.*, and the
// rotation finishes. Before the switch was a sequence of idempotent steps,
// a crash after its first rename left no signing.key, and the rerun failed
// at once (rename signing.key: no such file or directory).
func TestSwitchSigningKeyRerunAfterCrash(t *testing.T) {
	steps := []string{SignPreviousKey, SignPreviousPub, SignKey, SignPub, "remove " + SignNextPub, "remove " + SignNextKey}
	renames := [][2]string{{SignKey, SignPreviousKey}, {SignPub, SignPreviousPub}, {SignNextKey, SignKey}, {SignNextPub, SignPub}}
	type crash struct {
		name string
		stop func(t *testing.T, dir string)
	}
	var crashes []crash
	for _, step := range steps {
		crashes = append(crashes, crash{"after " + step, func(t *testing.T, dir string) {
			err := switchSigningKey(dir, func(s string) error {
				if s == step {
					return errCrash
				}
				return nil
			})
			if !errors.Is(err, errCrash) {
				t.Fatalf("the switch did not stop after %s: %v", step, err)
			}
		}})
	}
	for n := 1; n < len(renames); n++ {
		crashes = append(crashes, crash{fmt.Sprintf("an older switch after rename %d", n), func(t *testing.T, dir string) {
			for _, mv := range renames[:n] {
				if err := os.Rename(filepath.Join(dir, mv[0]), filepath.Join(dir, mv[1])); err != nil {
					t.Fatal(err)
				}
			}
		}})
	}
	crashes = append(crashes, crash{"done", func(t *testing.T, dir string) {
		if err := SwitchSigningKey(dir); err != nil {
			t.Fatal(err)
		}
	}})
	for _, c := range crashes {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := CreateCA(dir, 0); err != nil {
				t.Fatal(err)
			}
			old, err := LoadSigningKey(filepath.Join(dir, SignKey))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := BeginSigningRotation(dir); err != nil {
				t.Fatal(err)
			}
			next, err := LoadSigningKey(filepath.Join(dir, SignNextKey))
			if err != nil {
				t.Fatal(err)
			}
			c.stop(t, dir)
			if err := SwitchSigningKey(dir); err != nil {
				t.Fatalf("the rerun: %v", err)
			}
			checkSigningPair(t, dir, SignKey, SignPub, next)
			checkSigningPair(t, dir, SignPreviousKey, SignPreviousPub, old)
			for _, f := range []string{SignNextKey, SignNextPub} {
				if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: %v, want it gone", f, err)
				}
			}
			if err := FinishSigningRotation(dir); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSwitchSigningKeyRefusesAnotherPrevious: a signing-previous.key of
// another key than signing.key's, before the switch, is an unfinished
// rotation: the switch refuses and changes nothing.
func TestSwitchSigningKeyRefusesAnotherPrevious(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := BeginSigningRotation(dir); err != nil {
		t.Fatal(err)
	}
	old, err := LoadSigningKey(filepath.Join(dir, SignKey))
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := CreateCA(other, 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range [][2]string{{SignKey, SignPreviousKey}, {SignPub, SignPreviousPub}} {
		b, err := os.ReadFile(filepath.Join(other, f[0]))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f[1]), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := SwitchSigningKey(dir); !errors.Is(err, ErrRotation) {
		t.Fatalf("switch: %v, want ErrRotation", err)
	}
	checkSigningPair(t, dir, SignKey, SignPub, old)
}

// checkSigningPair checks that the key and pub files hold key.
func checkSigningPair(t *testing.T, dir, keyFile, pubFile string, key ed25519.PrivateKey) {
	t.Helper()
	got, err := LoadSigningKey(filepath.Join(dir, keyFile))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(key) {
		t.Errorf("%s holds %s, want %s", keyFile, api.SigningKeyFingerprint(got.Public().(ed25519.PublicKey)), api.SigningKeyFingerprint(key.Public().(ed25519.PublicKey)))
	}
	pub, err := LoadVerifyKey(filepath.Join(dir, pubFile))
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(key.Public()) {
		t.Errorf("%s does not match %s", pubFile, keyFile)
	}
}

// TestBeginSigningRotationRerunAfterCrash: a begin stopped after it wrote
// signing-next.key (and maybe .pub) but not the chain is finished by a
// rerun, which endorses the key already there; until then the switch
// refuses, since agents would refuse masters signing with a key no chain
// endorses. Before, the rerun refused (a rotation under way), --finish
// refused (switch first), and the switch went ahead without a chain.
func TestBeginSigningRotationRerunAfterCrash(t *testing.T) {
	for _, tc := range []struct {
		name string
		lost []string // the files the crash left unwritten
	}{
		{"after signing-next.key", []string{SignNextPub, SignChain}},
		{"after signing-next.pub", []string{SignChain}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := CreateCA(dir, 0); err != nil {
				t.Fatal(err)
			}
			old, err := LoadSigningKey(filepath.Join(dir, SignKey))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := BeginSigningRotation(dir); err != nil {
				t.Fatal(err)
			}
			next, err := LoadSigningKey(filepath.Join(dir, SignNextKey))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.lost {
				if err := os.Remove(filepath.Join(dir, f)); err != nil {
					t.Fatal(err)
				}
			}
			if err := SwitchSigningKey(dir); err == nil {
				t.Fatal("the switch went ahead with no chain to the new key")
			}
			checkSigningPair(t, dir, SignKey, SignPub, old)
			link, err := BeginSigningRotation(dir)
			if err != nil {
				t.Fatalf("the rerun: %v", err)
			}
			if link.Key != api.EncodeSigningKey(next.Public().(ed25519.PublicKey)) {
				t.Errorf("the rerun endorses another key than signing-next.key's")
			}
			checkSigningPair(t, dir, SignNextKey, SignNextPub, next)
			if _, err := BeginSigningRotation(dir); !errors.Is(err, ErrRotation) {
				t.Errorf("a begin after a whole one: %v, want ErrRotation", err)
			}
			if err := SwitchSigningKey(dir); err != nil {
				t.Fatal(err)
			}
			checkSigningPair(t, dir, SignKey, SignPub, next)
		})
	}
}

// TestSwitchSigningKeyRefusesAChainElsewhere: a chain that does not lead
// from the current key to signing-next.key's (another rotation's) stops
// the switch before it changes anything.
func TestSwitchSigningKeyRefusesAChainElsewhere(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if err := CreateCA(d, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := BeginSigningRotation(d); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(other, SignChain))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SignChain), b, 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := LoadSigningKey(filepath.Join(dir, SignKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := SwitchSigningKey(dir); !errors.Is(err, ErrRotation) {
		t.Fatalf("switch: %v, want ErrRotation", err)
	}
	checkSigningPair(t, dir, SignKey, SignPub, old)
}
