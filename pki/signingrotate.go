package pki

// Rotation of the masters' record-signing key: a new key pair, and the
// chain link that endorses it with the old key (api.SigningChain).

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/atomicfile"
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
// SwitchSigningKey. One rotation at a time. A begin that stopped half way
// (signing-next.key written, signing-chain.json not) is finished by a
// rerun, which endorses the key already in signing-next.key.
func BeginSigningRotation(dir string) (api.SigningLink, error) {
	path := func(name string) string { return filepath.Join(dir, name) }
	if _, err := os.Stat(path(SignPreviousKey)); err == nil {
		return api.SigningLink{}, fmt.Errorf("pki: %w: %s is there: a rotation is under way (finish it first: carve certs rotate-signing --finish)", ErrRotation, path(SignPreviousKey))
	}
	cur, err := LoadSigningKey(path(SignKey))
	if err != nil {
		return api.SigningLink{}, err
	}
	underWay := fmt.Errorf("pki: %w: %s is there: a rotation is under way (switch to it: carve certs rotate-signing --switch)", ErrRotation, path(SignNextKey))
	next, err := LoadSigningKey(path(SignNextKey))
	var keyPEM, pubPEM []byte
	switch {
	case err == nil:
		// Begun before: done when the chain endorses the new key with
		// the current one; else this finishes it.
		if chain, err := LoadSigningChain(path(SignChain)); err == nil && chain.Reaches(cur.Public().(ed25519.PublicKey), next.Public().(ed25519.PublicKey)) {
			return api.SigningLink{}, underWay
		}
		// Its key file is there already: only the public half is written.
		if _, pubPEM, err = signingKeyFiles(next); err != nil {
			return api.SigningLink{}, err
		}
	case errors.Is(err, os.ErrNotExist):
		if _, next, err = ed25519.GenerateKey(rand.Reader); err != nil {
			return api.SigningLink{}, fmt.Errorf("pki: signing key: %w", err)
		}
		if keyPEM, pubPEM, err = signingKeyFiles(next); err != nil {
			return api.SigningLink{}, err
		}
		// Never over a key another begin wrote meanwhile.
		if err := atomicfile.WriteNew(path(SignNextKey), keyPEM, 0o600); errors.Is(err, os.ErrExist) {
			return api.SigningLink{}, underWay
		} else if err != nil {
			return api.SigningLink{}, fmt.Errorf("pki: begin a signing key rotation: %w", err)
		}
	default:
		return api.SigningLink{}, err
	}
	link := api.NewSigningLink(cur, next.Public().(ed25519.PublicKey))
	b, err := json.MarshalIndent(&api.SigningChain{Links: []api.SigningLink{link}}, "", "  ")
	if err != nil {
		return api.SigningLink{}, fmt.Errorf("pki: signing chain: %w", err)
	}
	// The chain last: while it is missing, a rerun finishes the begin, and
	// the switch refuses.
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{SignNextPub, pubPEM, 0o644}, {SignChain, append(b, '\n'), 0o644}} {
		if err := atomicfile.Write(path(f.name), f.data, f.mode); err != nil {
			return api.SigningLink{}, fmt.Errorf("pki: begin a signing key rotation: %w (rerun it once fixed)", err)
		}
	}
	return link, nil
}

// SwitchSigningKey makes the new key of BeginSigningRotation the signing
// key: the current pair is kept as signing-previous.key and .pub, the new
// one becomes signing.key and .pub, and signing-next.* go. The masters
// then sign with it, the chain still served.
//
// A switch stopped at any point (a crash, a full disk) is rerun safely:
// each step writes what the end state holds, found from the keys the files
// hold rather than from which names exist, so a rerun finishes the switch
// (a rerun once it is done changes nothing). Every file is written whole
// and durably (atomicfile).
func SwitchSigningKey(dir string) error {
	return switchSigningKey(dir, nil)
}

// switchSigningKey is SwitchSigningKey; after, when set, is called after
// each step with its name, and an error from it stops the switch there
// (the tests' crash).
func switchSigningKey(dir string, after func(step string) error) error {
	path := func(name string) string { return filepath.Join(dir, name) }
	next, err := LoadSigningKey(path(SignNextKey))
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Switched already, unless no rotation is under way: signing.key
		// is the new key, signing-previous.key the old one.
		if _, perr := os.Stat(path(SignPreviousKey)); perr != nil {
			return fmt.Errorf("pki: %w: no %s: begin a rotation first (carve certs rotate-signing)", ErrRotation, path(SignNextKey))
		}
		if next, err = LoadSigningKey(path(SignKey)); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	newPub := next.Public().(ed25519.PublicKey)
	old, err := LoadSigningKey(path(SignKey))
	switch {
	case err == nil && !newPub.Equal(old.Public()):
		// Not switched yet: signing.key is the key being replaced.
		if prev, perr := LoadSigningKey(path(SignPreviousKey)); perr == nil && !prev.Equal(old) {
			return fmt.Errorf("pki: %w: %s holds another key than %s, the key being replaced: an earlier rotation is unfinished (carve certs rotate-signing --finish after its switch)",
				ErrRotation, path(SignPreviousKey), path(SignKey))
		}
	case err == nil || errors.Is(err, os.ErrNotExist):
		// signing.key is the new key already, or gone (a switch of an
		// older carve, by renames, stopped after its first): the key
		// being replaced is in signing-previous.key.
		if old, err = LoadSigningKey(path(SignPreviousKey)); err != nil {
			return fmt.Errorf("pki: %w: neither %s nor %s holds the key being replaced: %w", ErrRotation, path(SignKey), path(SignPreviousKey), err)
		}
	default:
		return err
	}
	// The agents follow the masters to the new key only through the
	// chain: without it they would refuse every master that switched.
	chain, err := LoadSigningChain(path(SignChain))
	if err != nil {
		return fmt.Errorf("%w (rerun carve certs rotate-signing, which writes it, and give it to every master)", err)
	}
	if !chain.Reaches(old.Public().(ed25519.PublicKey), newPub) {
		return fmt.Errorf("pki: %w: %s does not lead from the key being replaced to the new one: the agents would refuse the masters once switched",
			ErrRotation, path(SignChain))
	}
	oldKey, oldPub, err := signingKeyFiles(old)
	if err != nil {
		return err
	}
	newKey, newPubPEM, err := signingKeyFiles(next)
	if err != nil {
		return err
	}
	// In this order: the old key is kept before signing.key is replaced,
	// and signing-next.key, which says a switch is under way, goes last.
	steps := []struct {
		name string
		do   func() error
	}{
		{SignPreviousKey, func() error { return atomicfile.Write(path(SignPreviousKey), oldKey, 0o600) }},
		{SignPreviousPub, func() error { return atomicfile.Write(path(SignPreviousPub), oldPub, 0o644) }},
		{SignKey, func() error { return atomicfile.Write(path(SignKey), newKey, 0o600) }},
		{SignPub, func() error { return atomicfile.Write(path(SignPub), newPubPEM, 0o644) }},
		{"remove " + SignNextPub, func() error { return atomicfile.Remove(path(SignNextPub)) }},
		{"remove " + SignNextKey, func() error { return atomicfile.Remove(path(SignNextKey)) }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("pki: switch the signing key: %s: %w (rerun the switch once fixed)", st.name, err)
		}
		if after != nil {
			if err := after(st.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// signingKeyFiles encodes a record-signing key pair as its .key and .pub
// files hold it.
func signingKeyFiles(priv ed25519.PrivateKey) (key, pub []byte, err error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: encode key: %w", err)
	}
	if pub, err = EncodeVerifyKey(priv.Public().(ed25519.PublicKey)); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), pub, nil
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
