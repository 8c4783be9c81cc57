package podmanlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// Run starts a detached container called name from the lab's busybox root
// file system on a CNI network, as `podman run -d --rootfs DIR --network
// NETWORK` does, with the requested address when ip is not empty (`--ip`,
// which reaches the plugins as IP= in CNI_ARGS). cmd defaults to a long
// sleep. It returns the container's id.
func (p *Podman) Run(ctx context.Context, name, network, ip string, cmd ...string) (string, error) {
	if len(cmd) == 0 {
		cmd = []string{"/bin/sleep", "3600"}
	}
	args := []string{"run", "--detach", "--name", name, "--network", network, "--cgroup-parent", "/" + p.cgroup}
	if ip != "" {
		args = append(args, "--ip", ip)
	}
	args = append(append(args, "--rootfs", p.rootfs), cmd...)
	out, err := p.Command(ctx, args...)
	if err != nil {
		return "", fmt.Errorf("run %s on %s: %w", name, network, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// inspect is what IP reads of `podman inspect`.
type inspect struct {
	ID    string `json:"Id"`
	State struct {
		Running   bool
		ConmonPid int
	}
	NetworkSettings struct {
		Networks map[string]struct {
			IPAddress   string
			IPPrefixLen int
			Gateway     string
		}
	}
}

func (p *Podman) inspect(ctx context.Context, id string) (inspect, error) {
	out, err := p.Command(ctx, "container", "inspect", "--format", "json", id)
	if err != nil {
		return inspect{}, err
	}
	var got []inspect
	if err := json.Unmarshal(out, &got); err != nil {
		return inspect{}, fmt.Errorf("podman inspect %s: %w", id, err)
	}
	if len(got) != 1 {
		return inspect{}, fmt.Errorf("podman inspect %s: %d answers", id, len(got))
	}
	return got[0], nil
}

// IP is the container's IPv4 address on its only network, as `podman
// inspect` reports it (from the CNI result).
func (p *Podman) IP(ctx context.Context, id string) (netip.Addr, error) {
	c, err := p.inspect(ctx, id)
	if err != nil {
		return netip.Addr{}, err
	}
	if n := len(c.NetworkSettings.Networks); n != 1 {
		return netip.Addr{}, fmt.Errorf("container %.12s is on %d networks, not one", id, n)
	}
	var a netip.Addr
	for name, ep := range c.NetworkSettings.Networks {
		if a, err = netip.ParseAddr(ep.IPAddress); err != nil {
			return netip.Addr{}, fmt.Errorf("container %.12s on %s: address %q: %w", id, name, ep.IPAddress, err)
		}
	}
	return a, nil
}

// Exec runs cmd in a running container, as `podman exec` does, and returns
// its output (stdout and stderr) and exit code. An error means the command
// did not run (Podman's own failures exit 125, 126 or 127).
func (p *Podman) Exec(ctx context.Context, id string, cmd ...string) ([]byte, int, error) {
	out, err := p.Command(ctx, append([]string{"exec", id}, cmd...)...)
	var ce *CommandError
	var ee *exec.ExitError
	if errors.As(err, &ce) && errors.As(err, &ee) && ee.ExitCode() > 0 && ee.ExitCode() < 125 {
		return append(out, ce.Stderr...), ee.ExitCode(), nil
	}
	if err != nil {
		return out, 0, fmt.Errorf("exec in %.12s: %w", id, err)
	}
	return out, 0, nil
}

// Remove removes a container, running or not, as `podman rm -f` does:
// Podman stops it and calls CNI DEL for its networks before it returns.
func (p *Podman) Remove(ctx context.Context, id string) error {
	if _, err := p.Command(ctx, "rm", "--force", "--time", "0", id); err != nil {
		return fmt.Errorf("remove %.12s: %w", id, err)
	}
	return nil
}
