package enginelab

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// busyboxApplets are the busybox applets linked in the root file system's
// bin/: a shell, sleep for a container that waits, ping and ip to look at
// its network.
func busyboxApplets() []string { return []string{"sh", "sleep", "ping", "ip"} }

// StaticBusybox finds a statically linked busybox (a dynamic one would need
// its libraries in the image).
func StaticBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		f.Close()
		if !dynamic {
			return p, nil
		}
		return "", fmt.Errorf("%s is dynamically linked (install Debian's busybox-static)", p)
	}
	return "", errors.New("no busybox in /bin or /usr/bin (install Debian's busybox-static)")
}

// BusyboxRootfs returns a root file system as an uncompressed tar (an image
// layer): /bin/busybox read from the file busybox, and the applets (sh,
// sleep, ping, ip) linked to it in /bin. No registry is reachable from a
// lab.
func BusyboxRootfs(busybox string) ([]byte, error) {
	return BusyboxLayer(busybox, busyboxApplets(), nil, nil)
}

// BusyboxApplets lists every applet the busybox binary at path has
// (`busybox --list`), for an image whose users run commands it does not
// know in advance (critest's specs run top, cat, hostname, httpd...).
func BusyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("enginelab: %s --list: %w", busybox, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		// The binary itself is bin/busybox; a name with a slash is no applet.
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	return applets, nil
}

// BusyboxLayer returns a root file system as an uncompressed tar (an image
// layer): /bin/busybox read from the file busybox, applets linked to it in
// /bin, the directories dirs (e.g. "etc", "www") and the regular files
// files (path without a leading slash: content, mode 0644; their
// directories must be among dirs).
func BusyboxLayer(busybox string, applets, dirs []string, files map[string]string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdrs := []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				return nil, err
			}
		}
	}
	for _, l := range applets {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: strings.TrimSuffix(d, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	// In a stable order: the same inputs, the same layer digest.
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(tw, data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BusyboxRootfsDir writes the root file system of BusyboxRootfs into dir
// (created if missing; it should be empty), the form `podman run --rootfs`
// takes.
func BusyboxRootfsDir(dir, busybox string) error {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("enginelab: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return fmt.Errorf("enginelab: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), bin, 0o755); err != nil {
		return fmt.Errorf("enginelab: %w", err)
	}
	for _, l := range busyboxApplets() {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", l)); err != nil {
			return fmt.Errorf("enginelab: %w", err)
		}
	}
	return nil
}
