package certscmd

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// secureMaster runs a TLS master and returns it with the flags of a client
// holding a certificate of the role (name: its holder).
func secureMaster(t *testing.T) *mastertest.Secure {
	t.Helper()
	return mastertest.StartSecure(t, filepath.Join(t.TempDir(), "m1"), netconfig.Default(), slog.New(slog.DiscardHandler))
}

// clientFlags are --masters and the TLS flags of a certificate of role.
func clientFlags(m *mastertest.Secure, name string, role pki.Role) []string {
	f := m.CA.Files(name, role)
	return []string{"--masters", "https://" + m.HTTPAddr(), "--ca-file", f.CA, "--cert-file", f.Cert, "--key-file", f.Key}
}

// registerAgents registers agents id -> underlay IP with their own certificates.
func registerAgents(t *testing.T, m *mastertest.Secure, agents map[string]string) {
	t.Helper()
	for id, ip := range agents {
		m.CA.IssueAgent(id, netip.MustParseAddr(ip))
		c, err := api.NewClientWith([]string{"https://" + m.HTTPAddr()}, api.ClientOptions{TLS: m.CA.ClientTLS(id, pki.RoleAgent)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = c.Register(ctx, api.RegisterRequest{AgentID: id, IP: ip, NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}})
		cancel()
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
}

// run runs a command function and returns its output and exit code.
func run(t *testing.T, cmd func(context.Context, []string, *bytes.Buffer) error, args ...string) (string, int, error) {
	t.Helper()
	var out bytes.Buffer
	err := cmd(context.Background(), args, &out)
	return out.String(), cli.ExitCode(err), err
}
