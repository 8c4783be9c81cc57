package wireguard

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "wireguard.key")
	key, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != KeyFileMode {
		t.Errorf("key file mode %#o, want %#o", fi.Mode().Perm(), KeyFileMode)
	}
	again, err := LoadOrCreateKey(path)
	if err != nil || again != key {
		t.Fatalf("second load: %v, same key %v", err, again == key)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key readable by others: %v, want a refusal naming the fix", err)
	}
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(path); err == nil {
		t.Error("a file without a key loaded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}

// TestLoadPendingKeys: pending files are taken by the key they hold, not
// by their name alone.
func TestLoadPendingKeys(t *testing.T) {
	keys := make([]wgtypes.Key, 3)
	for i := range keys {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	current, a, b := keys[0], keys[1], keys[2]
	type file struct {
		name string // beside the key file; "A" and "B": a's and b's pending names
		data string
		mode os.FileMode
	}
	for _, tc := range []struct {
		name        string
		files       []file
		wantPending []wgtypes.Key
		wantFiles   []string // pending files left, by name as in files
		wantDropped int
		wantErr     bool
	}{
		{name: "none"},
		{name: "one", files: []file{{"A", a.String(), 0o600}}, wantPending: []wgtypes.Key{a}, wantFiles: []string{"A"}},
		{name: "the current key, installed already", files: []file{{"A", current.String(), 0o600}}, wantDropped: 1},
		{name: "no key", files: []file{{"A", "garbage", 0o600}}, wantDropped: 1},
		{name: "another key than its name's", files: []file{{"A", b.String(), 0o600}}, wantPending: []wgtypes.Key{b}, wantFiles: []string{"B"}, wantDropped: 1},
		{name: "the old single name", files: []file{{"wireguard.key.next", a.String(), 0o600}}, wantPending: []wgtypes.Key{a}, wantFiles: []string{"A"}, wantDropped: 1},
		{name: "readable by others", files: []file{{"A", a.String(), 0o644}}, wantErr: true, wantFiles: []string{"A"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			keyPath := filepath.Join(dir, "wireguard.key")
			if err := WriteKey(keyPath, current); err != nil {
				t.Fatal(err)
			}
			name := func(n string) string {
				switch n {
				case "A":
					return PendingKeyPath(keyPath, a)
				case "B":
					return PendingKeyPath(keyPath, b)
				}
				return filepath.Join(dir, n)
			}
			for _, f := range tc.files {
				if err := os.WriteFile(name(f.name), []byte(f.data+"\n"), f.mode); err != nil {
					t.Fatal(err)
				}
			}
			pending, dropped, err := LoadPendingKeys(keyPath, current)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want an error: %v", err, tc.wantErr)
			}
			var got []wgtypes.Key
			for _, p := range pending {
				got = append(got, p.Key)
			}
			if !slices.Equal(got, tc.wantPending) {
				t.Errorf("pending %v, want %v", got, tc.wantPending)
			}
			if len(dropped) != tc.wantDropped {
				t.Errorf("dropped %v, want %d", dropped, tc.wantDropped)
			}
			var want []string
			for _, n := range tc.wantFiles {
				want = append(want, name(n))
			}
			files, err := filepath.Glob(keyPath + ".next*")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(files, want) {
				t.Errorf("files %v, want %v", files, want)
			}
		})
	}
}
