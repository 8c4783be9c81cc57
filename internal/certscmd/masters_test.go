package certscmd

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// secureMaster runs a TLS master with a new cluster CA.
func secureMaster(t *testing.T) *mastertest.Secure {
	t.Helper()
	return mastertest.StartSecure(t, filepath.Join(t.TempDir(), "m1"), netconfig.Default(), slog.New(slog.DiscardHandler))
}

// run runs a command function and returns its output and exit code.
func run(t *testing.T, cmd func(context.Context, []string, *bytes.Buffer) error, args ...string) (string, int, error) {
	t.Helper()
	var out bytes.Buffer
	err := cmd(context.Background(), args, &out)
	return out.String(), cli.ExitCode(err), err
}
