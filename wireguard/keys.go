package wireguard

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/internal/atomicfile"
)

// KeyFileMode is the mode of a private key file: the key never leaves its
// host, and only root reads it there.
const KeyFileMode = 0o600

// ErrNotAKey marks a key file that holds no WireGuard key.
var ErrNotAKey = errors.New("not a WireGuard private key")

// LoadOrCreateKey reads the private key in path (base64, as `wg genkey`
// writes it), or makes one and writes it there with mode 0600 when the
// file does not exist. A key file readable by others is refused.
func LoadOrCreateKey(path string) (wgtypes.Key, error) {
	key, err := LoadKey(path)
	if !errors.Is(err, os.ErrNotExist) {
		return key, err
	}
	if key, err = wgtypes.GeneratePrivateKey(); err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard: make a key: %w", err)
	}
	if err := atomicfile.WriteNew(path, keyBytes(key), KeyFileMode); errors.Is(err, os.ErrExist) {
		return LoadKey(path) // made meanwhile by another: that one counts
	} else if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard: write key %s: %w", path, err)
	}
	return key, nil
}

// LoadKey reads the private key in path. A file that holds no key wraps
// ErrNotAKey.
func LoadKey(path string) (wgtypes.Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard: key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return wgtypes.Key{}, fmt.Errorf("wireguard: key file %s has mode %#o: a private key must not be readable by others (chmod 600 it)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard: key file: %w", err)
	}
	key, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard: key file %s: %w: %w", path, ErrNotAKey, err)
	}
	return key, nil
}

// WriteKey writes a private key to path, whole or not at all, durably
// (atomicfile.Write, mode 0600).
func WriteKey(path string, key wgtypes.Key) error {
	if err := atomicfile.Write(path, keyBytes(key), KeyFileMode); err != nil {
		return fmt.Errorf("wireguard: write key %s: %w", path, err)
	}
	return nil
}

func keyBytes(key wgtypes.Key) []byte { return []byte(key.String() + "\n") }

// A rotation's new key waits for the masters' signature in a pending file
// beside the key file, named by the fingerprint of its public key:
// KEYFILE.next-FINGERPRINT. Each rotation has its own file, so that one
// rotation close behind another never overwrites a key the masters may
// be signing, and the key installed is the one the file's name says.

// pendingInfix separates a pending file's name from its fingerprint.
const pendingInfix = ".next-"

// KeyFingerprint names a public key in pending file names: the hex of the
// first 8 bytes of its SHA-256.
func KeyFingerprint(pub wgtypes.Key) string {
	sum := sha256.Sum256(pub[:])
	return hex.EncodeToString(sum[:8])
}

// PendingKeyPath is the pending file of the private key key beside the key
// file keyPath.
func PendingKeyPath(keyPath string, key wgtypes.Key) string {
	return keyPath + pendingInfix + KeyFingerprint(key.PublicKey())
}

// WritePendingKey writes a rotation's private key to its pending file
// (PendingKeyPath), durably: before the masters hear of its public key,
// since a signed public key whose private half was lost cuts the host off.
func WritePendingKey(keyPath string, key wgtypes.Key) error {
	return WriteKey(PendingKeyPath(keyPath, key), key)
}

// RemovePendingKey removes a pending file (gone already: no error).
func RemovePendingKey(keyPath string, key wgtypes.Key) error {
	if err := atomicfile.Remove(PendingKeyPath(keyPath, key)); err != nil {
		return fmt.Errorf("wireguard: pending key: %w", err)
	}
	return nil
}

// PendingKey is a rotation's key found in its pending file.
type PendingKey struct {
	Key wgtypes.Key
	// Written is the file's modification time: the newest pending key is
	// the one to register.
	Written time.Time
}

// LoadPendingKeys reads the pending files beside keyPath, newest first,
// each recognised by the key it holds rather than by its name: a file that
// holds no key, or holds current (installed already, its removal lost at a
// crash), is removed and listed in dropped; a key under another name than
// its fingerprint's (keyPath+".next", of carve before pending files were
// named by fingerprint) is moved to its own name and kept. A file readable
// by others is an error, as for the key file.
func LoadPendingKeys(keyPath string, current wgtypes.Key) (pending []PendingKey, dropped []string, err error) {
	paths, err := filepath.Glob(globEscape(keyPath) + pendingInfix + "*")
	if err != nil {
		return nil, nil, fmt.Errorf("wireguard: pending keys: %w", err)
	}
	paths = append(paths, keyPath+".next")
	seen := map[wgtypes.Key]int{}
	for _, path := range paths {
		fi, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("wireguard: pending key: %w", err)
		}
		key, err := LoadKey(path)
		if err != nil && !errors.Is(err, ErrNotAKey) {
			return nil, nil, err
		}
		if err != nil || key == current {
			if err := atomicfile.Remove(path); err != nil {
				return nil, nil, fmt.Errorf("wireguard: stale pending key: %w", err)
			}
			dropped = append(dropped, path)
			continue
		}
		if path != PendingKeyPath(keyPath, key) {
			if err := WritePendingKey(keyPath, key); err != nil {
				return nil, nil, err
			}
			if err := atomicfile.Remove(path); err != nil {
				return nil, nil, fmt.Errorf("wireguard: pending key: %w", err)
			}
			dropped = append(dropped, path)
		}
		if i, ok := seen[key]; ok {
			if fi.ModTime().After(pending[i].Written) {
				pending[i].Written = fi.ModTime()
			}
			continue
		}
		seen[key] = len(pending)
		pending = append(pending, PendingKey{Key: key, Written: fi.ModTime()})
	}
	sort.SliceStable(pending, func(i, j int) bool { return pending[i].Written.After(pending[j].Written) })
	return pending, dropped, nil
}

// globEscape quotes the glob metacharacters of a literal path.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
