package labcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// LabBinaryEnv names the environment variable that carries the path of the
// carve-lab binary (StartRogue runs it) to tests, set by RunTests.
const LabBinaryEnv = "CARVE_LAB_BINARY"

// BuildCarve builds ./cmd/carve of the current module into dir/carve and
// returns the binary's path.
func BuildCarve(ctx context.Context, dir string) (string, error) {
	return BuildTool(ctx, dir, "./cmd/carve")
}

// BuildLab builds ./test/cmd/carve-lab of the current module into
// dir/carve-lab and returns the binary's path.
func BuildLab(ctx context.Context, dir string) (string, error) {
	return BuildTool(ctx, dir, "./test/cmd/carve-lab")
}

// CNIPathEnv names the environment variable that carries the directory of
// the CNI plugins (carve-ipam and the reference plugins) to tests, set by
// RunTests next to BinaryEnv; set it yourself to skip the build.
const CNIPathEnv = "CARVE_CNI_PATH"

// CNIPlugins are the binaries a cluster's CNI attachments run: carve-ipam,
// the reference plugins carve's conflists chain (bridge, portmap), loopback,
// and host-local for comparisons.
func CNIPlugins() []string {
	return []string{"carve-ipam", "bridge", "loopback", "portmap", "host-local"}
}

// cniPackages are the packages of CNIPlugins, in the same order (carve-ipam
// first: BuildCNIPlugins builds it apart, static). The
// reference plugins come from the github.com/containernetworking/plugins
// version pinned in go.mod, as deploy/build-cni-plugins.sh builds them.
func cniPackages() []string {
	const ref = "github.com/containernetworking/plugins/plugins/"
	return []string{"./cmd/carve-ipam", ref + "main/bridge", ref + "main/loopback", ref + "meta/portmap", ref + "ipam/host-local"}
}

// BuildCNIPlugins builds CNIPlugins into dir (the build cache makes it
// cheap after the first run) and returns dir, ready to be a cluster's
// Options.CNIPath. carve-ipam is built static (CGO_ENABLED=0), as `make
// build` builds it; the reference plugins as their own build does.
func BuildCNIPlugins(ctx context.Context, dir string) (string, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	goCmd, err := goTool()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("labcluster: %w", err)
	}
	pkgs := cniPackages()
	for _, b := range []struct {
		env  []string
		pkgs []string
	}{{[]string{"CGO_ENABLED=0"}, pkgs[:1]}, {nil, pkgs[1:]}} {
		args := append([]string{"build", "-o", dir + string(os.PathSeparator)}, b.pkgs...)
		cmd := exec.CommandContext(ctx, goCmd, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.env...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("labcluster: %s go %s: %w\n%s", strings.Join(b.env, " "), strings.Join(args, " "), err, stderr.String())
		}
	}
	return dir, nil
}

// FindCNIPlugins returns the directories among dirs that hold CNIPlugins,
// the CNI_PATH to use, or an error naming the plugins found in none.
func FindCNIPlugins(dirs ...string) ([]string, error) {
	var path, missing []string
	for _, p := range CNIPlugins() {
		found := false
		for _, d := range dirs {
			if fi, err := os.Stat(filepath.Join(d, p)); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				found = true
				if !slices.Contains(path, d) {
					path = append(path, d)
				}
				break
			}
		}
		if !found {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("labcluster: CNI plugins %s not found in %s", strings.Join(missing, ", "), strings.Join(dirs, ", "))
	}
	return path, nil
}

// BenchRun is the workspace of one benchmark run in the lab: leftovers of a
// killed run with the same prefix removed, a temporary directory, and the
// carve binary and CNI plugins, built there unless given.
type BenchRun struct {
	Dir     string
	Binary  string
	CNIPath string // empty unless asked for
}

// NewBenchRun prepares a benchmark run: name names its temporary
// directory, binary and cniPath are used when set (else built), and the CNI
// plugins only when withCNI. Close removes the directory.
func NewBenchRun(ctx context.Context, prefix, name, binary, cniPath string, withCNI bool) (*BenchRun, error) {
	if killed, removed, err := RemoveStale(prefix); err != nil || len(killed)+len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "removed leftovers of a killed run: %d processes, %d namespaces (%v)\n", len(killed), len(removed), err)
	}
	dir, err := os.MkdirTemp("", "carve-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	r := &BenchRun{Dir: dir, Binary: binary, CNIPath: cniPath}
	if r.Binary == "" {
		if r.Binary, err = BuildCarve(ctx, dir); err != nil {
			r.Close()
			return nil, err
		}
	}
	if withCNI && r.CNIPath == "" {
		if r.CNIPath, err = BuildCNIPlugins(ctx, filepath.Join(dir, "cni-bin")); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Close removes the run's temporary directory.
func (r *BenchRun) Close() { _ = os.RemoveAll(r.Dir) }
