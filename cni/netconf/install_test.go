package netconf

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestInstallPlugin: a first install, the same binary again (nothing
// written), a new one (replaced), a missing source; the result is always
// mode 0755 and no temporary file stays.
func TestInstallPlugin(t *testing.T) {
	src := filepath.Join(t.TempDir(), "carve-ipam")
	bin := filepath.Join(t.TempDir(), "opt", "cni", "bin")
	for _, tc := range []struct {
		name    string
		content string // "" removes the source
		want    Install
		wantErr error
	}{
		{"first", "v1", Install{Path: filepath.Join(bin, PluginType)}, nil},
		{"same again", "v1", Install{Path: filepath.Join(bin, PluginType), Unchanged: true}, nil},
		{"upgrade", "v2", Install{Path: filepath.Join(bin, PluginType), Replaced: true}, nil},
		{"no source", "", Install{}, ErrNoPlugin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.content == "" {
				_ = os.Remove(src)
			} else if err := os.WriteFile(src, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := InstallPlugin(src, bin)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("InstallPlugin = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErr)
			}
			if tc.wantErr != nil {
				return
			}
			data, err := os.ReadFile(got.Path)
			st, serr := os.Stat(got.Path)
			if err != nil || string(data) != tc.content || serr != nil || st.Mode().Perm() != 0o755 {
				t.Errorf("installed %q (%v), mode %v (%v); want %q, 0755", data, err, st.Mode(), serr, tc.content)
			}
			assertOnlyFiles(t, bin, PluginType)
		})
	}
}
