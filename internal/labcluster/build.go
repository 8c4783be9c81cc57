package labcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BinaryEnv names the environment variable that carries the path of the
// carve binary to tests (set by RunTests; set it yourself to skip the build).
const BinaryEnv = "CARVE_BINARY"

// goTool finds the go command: on PATH, else where the Go tarball installs it.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
		return "/usr/local/go/bin/go", nil
	}
	return "", errors.New("labcluster: the go command is neither on PATH nor at /usr/local/go/bin/go")
}

// ModuleRoot returns the root directory of the main module the current
// directory belongs to, as `go env GOMOD` reports it.
func ModuleRoot(ctx context.Context) (string, error) {
	goCmd, err := goTool()
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, goCmd, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("labcluster: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("labcluster: not inside a Go module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// BuildCarve builds ./cmd/carve of the current module into dir/carve and
// returns the binary's path.
func BuildCarve(ctx context.Context, dir string) (string, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	goCmd, err := goTool()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "carve")
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", out, "./cmd/carve")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("labcluster: go build ./cmd/carve: %w\n%s", err, stderr.String())
	}
	return out, nil
}
