package labcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// RunCarve runs the cluster's carve binary with args from inside host h's
// namespace, where an operator on that host runs it: it reaches the masters
// and the agents over the underlay, like any other client. The caller
// passes --masters and the credentials (MasterURLs, OperatorArgs). It
// returns the standard output, and an error for a non-zero exit that
// carries the standard error (errors.As an *exec.ExitError gives the code).
func (c *Cluster) RunCarve(ctx context.Context, h *Host, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.opts.Binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := h.NS.Run(cmd); err != nil {
		return stdout.Bytes(), fmt.Errorf("labcluster: carve %s on %s: %w: %s", strings.Join(args, " "), h.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// ApplyConfig changes the cluster's network configuration as an operator
// does: it writes the masters' file (so that a cluster built anew from it
// starts the same) and runs `carve config apply` from host h's namespace
// with the operator's certificate. The committed configuration is the one
// authority; a master restarted with another file changes nothing.
func (c *Cluster) ApplyConfig(ctx context.Context, h *Host, cfg api.NetworkConfig) error {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("labcluster: encode network config: %w", err)
	}
	if err := os.WriteFile(c.configPath, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("labcluster: write network config: %w", err)
	}
	args := append([]string{"config", "apply", c.configPath, "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	if _, err := c.RunCarve(ctx, h, args...); err != nil {
		return err
	}
	c.network = netconfig.WithDefaults(cfg)
	return nil
}
