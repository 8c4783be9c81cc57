package wireguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// KeyFileMode is the mode of a private key file: the key never leaves its
// host, and only root reads it there.
const KeyFileMode = 0o600

// LoadOrCreateKey reads the private key in path (base64, as `wg genkey`
// writes it), or makes one and writes it there with mode 0600 when the
// file does not exist. A key file readable by others is refused.
func LoadOrCreateKey(path string) (wgtypes.Key, error) {
	key, err := LoadKey(path)
	if errors.Is(err, os.ErrNotExist) {
		if key, err = wgtypes.GeneratePrivateKey(); err != nil {
			return wgtypes.Key{}, fmt.Errorf("wireguard: make a key: %w", err)
		}
		return key, WriteKey(path, key)
	}
	return key, err
}

// LoadKey reads the private key in path.
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
		return wgtypes.Key{}, fmt.Errorf("wireguard: key file %s: %w", path, err)
	}
	return key, nil
}

// WriteKey writes a private key to path atomically (a temporary file in
// the same directory, mode 0600, fsynced, renamed).
func WriteKey(path string, key wgtypes.Key) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".wireguard-key-*")
	if err != nil {
		return fmt.Errorf("wireguard: write key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename: nothing left to remove
	err = f.Chmod(KeyFileMode)
	if err == nil {
		_, err = f.WriteString(key.String() + "\n")
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("wireguard: write key %s: %w", path, err)
	}
	return nil
}
