package labcluster

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
)

// BuildTool builds pkg, a package of this module (./cmd/carve) or one named
// by a `tool` directive of go.mod (sigs.k8s.io/cri-tools/cmd/crictl, at the
// version go.mod pins), into dir and returns the binary's path. The build cache makes it cheap after
// the first run.
func BuildTool(ctx context.Context, dir, pkg string) (string, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	goCmd, err := goTool()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, path.Base(pkg))
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", out, pkg)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("labcluster: go build %s: %w\n%s", pkg, err, stderr.String())
	}
	return out, nil
}
