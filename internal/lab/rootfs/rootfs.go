// Package rootfs builds the tiny root file system that lab containers run,
// as no registry is reachable from a lab: a static busybox and links to the
// applets the tests use. It writes it as a tar stream (an image that
// dockerlab imports) or as a directory (what `podman run --rootfs` and
// `ctr run --rootfs` take), from one layout.
package rootfs

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// applets are the busybox applets linked in bin/: a shell, sleep for a
// container that waits, ping and ip to look at its network.
func applets() []string { return []string{"sh", "sleep", "ping", "ip"} }

// StaticBusybox finds a statically linked busybox (a dynamic one would need
// its libraries in the root file system).
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

// WriteTar writes the root file system, holding a copy of busybox, to w as
// a tar stream.
func WriteTar(w io.Writer, busybox string) error {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))}); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if _, err := tw.Write(bin); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	for _, l := range applets() {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}

// WriteDir writes the root file system, holding a copy of busybox, into
// dir (created if missing; it should be empty).
func WriteDir(dir, busybox string) error {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), bin, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	for _, l := range applets() {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", l)); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	return nil
}
