package labcluster

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
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
