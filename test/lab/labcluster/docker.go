package labcluster

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/dockerlab"
	"github.com/carve-net/carve/test/lab/enginelab"
)

// DockerDriver is the IPAM driver name of the agents' Docker plugin in the
// lab (their --docker-plugin-socket is <DockerPluginDir>/carve.sock).
const DockerDriver = "carve"

// DockerPluginDir is the directory of h's agent's Docker plugin socket, which
// h's Docker engine (StartDocker) sees as /run/docker/plugins.
func (h *Host) DockerPluginDir() string { return filepath.Join(h.Dir, "docker-plugins") }

// DockerDir is the directory of h's Docker engine; the agent's --docker-host
// is its docker.sock, whether or not an engine runs.
func (h *Host) DockerDir() string { return filepath.Join(h.Dir, "docker") }

// StartDocker starts a real Docker engine (dockerlab) in h's namespace, on
// the socket h's agent watches and with its plugin directory; the agent
// creates the overlays' Docker networks on it (with Options.DockerBridge).
// Start it before the agent: an agent that found no engine tries again only
// every 30s. The error wraps dockerlab.ErrCannotRun when dockerd cannot run
// on this machine. Close stops the engine before the namespaces go.
func (c *Cluster) StartDocker(ctx context.Context, h *Host) (*dockerlab.Engine, error) {
	if err := os.MkdirAll(h.DockerPluginDir(), 0o755); err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	e, err := dockerlab.Start(ctx, h.NS, dockerlab.Options{Dir: h.DockerDir(), PluginDir: h.DockerPluginDir()})
	if err != nil {
		return nil, fmt.Errorf("labcluster: Docker engine on %s: %w", h.Name, err)
	}
	c.mu.Lock()
	c.engines = append(c.engines, e)
	c.mu.Unlock()
	c.log.Info("docker engine started", "host", h.Name, "socket", e.Host())
	return e, nil
}

// DockerContainer is a container a lab Docker engine runs on an overlay's
// Docker network.
type DockerContainer struct {
	Engine *dockerlab.Engine
	Host   *Host
	// ID is Docker's container id.
	ID string
	// Network is the Docker network it runs on.
	Network string
	// Addr is its IPv4 address with the bridge's prefix, and Gateway the
	// bridge's, as the engine reports them.
	Addr    netip.Prefix
	Gateway netip.Addr
}

// RunDockerContainer runs a busybox container on network, the Docker network
// h's agent created for an overlay on e (it waits until the agent has
// created it, with the plugin as its IPAM driver), as `docker run --net
// NETWORK` does.
func (c *Cluster) RunDockerContainer(ctx context.Context, h *Host, e *dockerlab.Engine, network string) (*DockerContainer, error) {
	busybox, err := enginelab.StaticBusybox()
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	err = retry.Until(ctx, 200*time.Millisecond, func() error {
		var n struct{ IPAM struct{ Driver string } }
		if err := e.Call(ctx, http.MethodGet, "/networks/"+url.PathEscape(network), nil, &n); err != nil {
			return err
		}
		if n.IPAM.Driver != DockerDriver {
			return fmt.Errorf("network %s has IPAM driver %q, want %q", network, n.IPAM.Driver, DockerDriver)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("labcluster: the Docker network %s of %s's agent: %w", network, h.Name, err)
	}
	if err := e.ImportBusybox(ctx, busybox); err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	id, err := e.Run(ctx, network)
	if err != nil {
		return nil, fmt.Errorf("labcluster: on %s: %w", h.Name, err)
	}
	ep, err := e.Endpoint(ctx, id, network)
	if err != nil {
		return nil, fmt.Errorf("labcluster: on %s: %w", h.Name, err)
	}
	addr, err := netip.ParseAddr(ep.IPAddress)
	if err != nil {
		return nil, fmt.Errorf("labcluster: container %.12s on %s: no IPv4 address (%+v)", id, h.Name, ep)
	}
	gw, _ := netip.ParseAddr(ep.Gateway)
	dc := &DockerContainer{Engine: e, Host: h, ID: id, Network: network, Addr: netip.PrefixFrom(addr, ep.IPPrefixLen), Gateway: gw}
	c.log.Info("docker container started", "host", h.Name, "id", id[:12], "network", network, "addr", dc.Addr)
	return dc, nil
}

// Ping pings dst from inside the Docker container (busybox ping through
// `docker exec`), trying up to attempts times, one second apart at most.
func (d *DockerContainer) Ping(ctx context.Context, dst netip.Addr, attempts int) error {
	var last error
	for i := 0; i < attempts; i++ {
		out, code, err := d.Engine.Exec(ctx, d.ID, "/bin/ping", "-c", "1", "-W", "1", dst.String())
		switch {
		case err != nil:
			last = err
		case code == 0:
			return nil
		default:
			last = fmt.Errorf("ping %s exited %d: %s", dst, code, strings.TrimSpace(string(out)))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("labcluster: docker container %.12s on %s: %w", d.ID, d.Host.Name, last)
}
