package certscmd

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

func certsCmd(ctx context.Context, args []string, out *bytes.Buffer) error {
	return Run(ctx, args, out)
}

// carve certs revoke by name reads the issued certificate, revokes it at
// the masters (deleting the agent), and the agent is refused from then
// on; bad flags exit 2 naming the fix.
func TestCertsRevoke(t *testing.T) {
	m := secureMaster(t)
	m.RegisterAgents(t, map[string]string{"h1": "198.18.0.11", "h2": "198.18.0.12"})
	op := m.ClientFlags("op", pki.RoleOperator)
	for _, tc := range []struct {
		name    string
		args    []string
		mention string
	}{
		{"neither name nor serial", nil, "give --name (with --dir) or --serial"},
		{"both", []string{"--dir", m.CA.Dir, "--name", "h1", "--serial", "ab"}, "give --name (with --dir) or --serial"},
		{"name without dir", []string{"--name", "h1"}, "--name needs --dir"},
		{"bad serial", []string{"--serial", "xyz"}, `--serial: serial "xyz"`},
		{"no such certificate", []string{"--dir", m.CA.Dir, "--name", "nobody"}, "revoke by --serial when the file is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, code, err := run(t, certsCmd, append(append([]string{"revoke"}, tc.args...), op...)...)
			if code == 0 || err == nil || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("exit %d, %v; want a refusal mentioning %q", code, err, tc.mention)
			}
		})
	}
	if _, code, err := run(t, certsCmd, append([]string{"revoke", "--dir", m.CA.Dir, "--name", "h1"}, m.ClientFlags("h2", pki.RoleAgent)...)...); code != cli.ExitCode(err) || err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("an agent revokes: exit %d, %v; want a 403", code, err)
	}
	out, code, err := run(t, certsCmd, append([]string{"revoke", "--dir", m.CA.Dir, "--name", "h1"}, op...)...)
	if code != 0 || !strings.Contains(out, "revoked agent/h1 (serial ") || !strings.Contains(out, "deleted agent h1") {
		t.Fatalf("revoke h1: exit %d, %v, output:\n%s", code, err, out)
	}
	cl, err := apiclient.NewClientWith([]string{"https://" + m.HTTPAddr()}, apiclient.ClientOptions{TLS: m.CA.ClientTLS("h1", pki.RoleAgent)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Register(ctx, api.RegisterRequest{AgentID: "h1", IP: "198.18.0.11"}); !api.IsCode(err, api.CodeRevoked) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("the revoked agent registers: %v, want 401 revoked", err)
	}
	// A new certificate of another name is served; revoking by serial
	// works too, and again is harmless.
	m.CA.IssueAgent("h3", netip.MustParseAddr("198.18.0.13"))
	cert, err := pki.ReadCertificate(pki.CertFile(m.CA.Dir, "h3"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out, code, err := run(t, certsCmd, append([]string{"revoke", "--serial", strings.ToUpper(pki.Serial(cert)), "--identity", "agent/h3"}, op...)...); code != 0 || !strings.Contains(out, "2 certificate(s) on the deny list") {
			t.Fatalf("revoke h3 by serial: exit %d, %v, output:\n%s", code, err, out)
		}
	}
}
