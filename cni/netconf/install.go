package netconf

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrNoPlugin marks an InstallPlugin source that is not there.
var ErrNoPlugin = errors.New("no carve-ipam to install")

// Install is what InstallPlugin did.
type Install struct {
	// Path is the installed plugin; Replaced says an older copy was there,
	// Unchanged that the same bytes were (nothing written).
	Path      string
	Replaced  bool
	Unchanged bool
}

// InstallPlugin copies the carve-ipam binary src into binDir, a runtime's
// CNI plugin directory (created if missing), as binDir/carve-ipam, mode
// 0755, atomically: a runtime that runs the plugin at any moment runs the
// old binary or the new one, never a partial file.
func InstallPlugin(src, binDir string) (Install, error) {
	in, err := InstallBinary(src, binDir, PluginType)
	if errors.Is(err, fs.ErrNotExist) {
		return Install{}, fmt.Errorf("%w: %s does not exist", ErrNoPlugin, src)
	}
	return in, err
}

// InstallBinary copies the plugin binary src into binDir as name, as
// InstallPlugin does carve-ipam: mode 0755, atomically, nothing written
// when the same bytes are there. A missing src is an error wrapping
// fs.ErrNotExist.
func InstallBinary(src, binDir, name string) (Install, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return Install{}, fmt.Errorf("cni: read %s: %w", src, err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return Install{}, fmt.Errorf("cni: create %s: %w", binDir, err)
	}
	in := Install{Path: filepath.Join(binDir, name)}
	old, err := os.ReadFile(in.Path)
	switch {
	case err == nil && bytes.Equal(old, data):
		if st, err := os.Stat(in.Path); err == nil && st.Mode().Perm() == 0o755 {
			in.Unchanged = true
			return in, nil
		}
		in.Replaced = true
	case err == nil:
		in.Replaced = true
	case !errors.Is(err, fs.ErrNotExist):
		return Install{}, fmt.Errorf("cni: read %s: %w", in.Path, err)
	}
	if err := writeAtomic(in.Path, data, 0o755); err != nil {
		return Install{}, err
	}
	return in, nil
}
