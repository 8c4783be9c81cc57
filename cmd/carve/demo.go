package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// labBinary is the demo's own binary, built next to carve by make build. The
// lab (namespaces, a cluster harness, libcni) lives there, not in carve.
const labBinary = "carve-lab"

// runDemo replaces this process with carve-lab, next to the carve binary,
// with the same flags: signals and Ctrl-C go straight to the lab, which
// cleans up. It returns only when the exec failed.
func runDemo(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the carve binary: %w", err)
	}
	lab, err := findLab(self)
	if err != nil {
		return err
	}
	argv := append([]string{lab}, args...)
	if err := syscall.Exec(lab, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", lab, err)
	}
	return nil
}

// findLab returns the path of carve-lab next to the carve binary self.
func findLab(self string) (string, error) {
	lab := filepath.Join(filepath.Dir(self), labBinary)
	fi, err := os.Stat(lab)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("needs bin/%s, not found at %s: run make build", labBinary, lab)
	case err != nil:
		return "", fmt.Errorf("needs bin/%s: %w", labBinary, err)
	case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
		return "", fmt.Errorf("needs bin/%s: %s is not an executable file: run make build", labBinary, lab)
	}
	return lab, nil
}
