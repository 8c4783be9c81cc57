package labcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
)

// AgentClient returns a client of h's agent, on h's current IP.
func (c *Cluster) AgentClient(h *Host) *api.AgentClient {
	return api.NewAgentClient(h.AgentURL(), c.http)
}

// agentArgs is h's agent command line on its current IP with its
// certificate and the mesh password, then the cluster's AgentArgs, then
// extra (later flags win).
func (c *Cluster) agentArgs(h *Host, extra []string) []string {
	ip := h.IP().Addr()
	args := []string{"agent",
		"--data-dir", h.AgentDataDir,
		"--masters", strings.Join(c.MasterURLs(), ","),
		"--ip", ip.String(),
		"--http-addr", hostPort(ip, AgentHTTPPort),
		"--mesh-addr", hostPort(ip, AgentMeshPort),
		"--socket", h.SocketPath(),
		"--cni-conf-dir", h.CNIConfDir(),
		"--mesos-cni-conf-dir", h.MesosCNIConfDir(),
		"--cni-version", c.opts.CNIVersion,
		"--cni-bin-dir", strings.Join(c.opts.CNIBinDirs, ":"),
		// The lab's runtime cache, never the machine's /var/lib/cni.
		"--cni-cache-dir", h.CNICacheDir(),
		// Nothing of Docker's on the machine: the plugin's socket in the
		// lab, and the lab's own engine, which runs only after StartDocker.
		"--docker-plugin-socket", filepath.Join(h.DockerPluginDir(), DockerDriver+".sock"),
		"--docker-host", "unix://" + filepath.Join(h.DockerDir(), "docker.sock"),
		"--mesos-bridge=true",
		"--docker-bridge=" + strconv.FormatBool(c.opts.DockerBridge),
		"--log-level", c.opts.LogLevel,
		"--wireguard-device", WireGuardDevice(h),
	}
	args = append(args, c.sec.agentArgs(h.CertName())...)
	args = append(args, c.opts.AgentArgs...)
	return append(args, extra...)
}

// StartAgent starts h's agent on the host's current IP, with extra flags
// appended (they override the harness's). It does not wait: see WaitAgent
// and WaitConverged.
func (c *Cluster) StartAgent(h *Host, extra ...string) error {
	if err := os.MkdirAll(h.AgentDataDir, 0o755); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	if err := h.Agent.Start(c.opts.Binary, c.agentArgs(h, extra)); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	c.log.Info("agent started", "host", h.Name, "ip", h.IP().Addr(), "pid", h.Agent.PID())
	return nil
}

// StopAgent stops h's agent with SIGTERM (SIGKILL after StopTimeout). The
// agent leaves its kernel state in place.
func (c *Cluster) StopAgent(ctx context.Context, h *Host) error {
	c.log.Info("stopping agent", "host", h.Name, "pid", h.Agent.PID())
	return h.Agent.Stop(ctx, 0)
}

// KillAgent kills h's agent with SIGKILL.
func (c *Cluster) KillAgent(h *Host) error {
	c.log.Info("killing agent", "host", h.Name, "pid", h.Agent.PID())
	return h.Agent.Kill()
}

// ResetAgentData deletes h's agent data dir (the agent must be stopped), so
// that the next start is a new agent with the new id newID: the harness
// issues it an agent certificate of that name.
func (c *Cluster) ResetAgentData(h *Host, newID string) error {
	if h.Agent.Running() {
		return fmt.Errorf("labcluster: agent on %s is running", h.Name)
	}
	if newID == h.CertName() {
		return fmt.Errorf("labcluster: agent on %s already is %s: a new agent needs a new id", h.Name, newID)
	}
	if err := c.sec.issue(pki.RoleAgent, newID, h.IP().Addr()); err != nil {
		return err
	}
	c.mu.Lock()
	h.agentID, h.certName = "", newID
	c.mu.Unlock()
	if err := os.RemoveAll(h.AgentDataDir); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	return nil
}

// agentReady reads h's agent and returns its record when every enabled
// overlay is STATUS_OK; it remembers the agent's id.
func (c *Cluster) agentReady(ctx context.Context, h *Host) (*api.AgentInfo, error) {
	if !h.Agent.Running() {
		return nil, retry.Permanent(fmt.Errorf("agent on %s is not running (%v); log:\n%s", h.Name, h.Agent.ExitErr(), h.Agent.Tail(20)))
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.AgentClient(h).Overlay(cctx)
	if err != nil {
		return nil, fmt.Errorf("agent on %s: %w", h.Name, err)
	}
	if info.AgentID != "" {
		c.mu.Lock()
		h.agentID = info.AgentID
		c.mu.Unlock()
	}
	if len(info.Overlays) == 0 {
		return info, fmt.Errorf("agent on %s (%s): no overlays yet", h.Name, info.AgentID)
	}
	var probs []string
	for _, ov := range info.Overlays {
		switch ov.State.Status {
		case api.StatusOK:
		default:
			probs = append(probs, fmt.Sprintf("%s %s %s", ov.Info.Name, ov.State.Status, ov.State.Error))
		}
	}
	if len(probs) > 0 {
		return info, fmt.Errorf("agent on %s (%s): %s", h.Name, info.AgentID, strings.Join(probs, "; "))
	}
	return info, nil
}

// WaitAgent waits until h's agent answers with every enabled overlay
// STATUS_OK, and returns its record.
func (c *Cluster) WaitAgent(ctx context.Context, h *Host) (*api.AgentInfo, error) {
	var info *api.AgentInfo
	err := retry.Until(ctx, 100*time.Millisecond, func() error {
		var err error
		info, err = c.agentReady(ctx, h)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("labcluster: wait for agent on %s: %w", h.Name, err)
	}
	return info, nil
}

// Converged returns nil when every running agent reports every enabled
// overlay STATUS_OK and `programmed: true` for every other running agent,
// and otherwise an error listing what is missing.
func (c *Cluster) Converged(ctx context.Context) error {
	var running []*Host
	for _, h := range c.Hosts() {
		if h.Agent.Running() {
			running = append(running, h)
		}
	}
	var errs []error
	ids := map[*Host]string{}
	for _, h := range running {
		info, err := c.agentReady(ctx, h)
		if info != nil && info.AgentID != "" {
			ids[h] = info.AgentID
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range running {
		if ids[h] == "" {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		peers, err := c.AgentClient(h).Peers(cctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("peers of %s: %w", h.Name, err))
			continue
		}
		programmed := map[string]bool{}
		for _, p := range peers.Peers {
			programmed[p.AgentID] = p.Programmed
		}
		for _, o := range running {
			if o == h {
				continue
			}
			id := ids[o]
			if id == "" {
				errs = append(errs, fmt.Errorf("%s: id of %s unknown yet", h.Name, o.Name))
				continue
			}
			p, known := programmed[id]
			switch {
			case !known:
				errs = append(errs, fmt.Errorf("%s does not know %s (%s)", h.Name, o.Name, id))
			case !p:
				errs = append(errs, fmt.Errorf("%s has not programmed %s (%s)", h.Name, o.Name, id))
			}
		}
	}
	return errors.Join(errs...)
}

// WaitConverged waits until Converged returns nil.
func (c *Cluster) WaitConverged(ctx context.Context) error {
	if err := retry.Until(ctx, 200*time.Millisecond, func() error { return c.Converged(ctx) }); err != nil {
		return fmt.Errorf("labcluster: not converged: %w", err)
	}
	return nil
}
