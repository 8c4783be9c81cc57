package certscmd

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

// certs runs carve certs with args and returns its exit code and output
// (what main would print on stdout and stderr).
func certs(args ...string) (int, string) {
	var out bytes.Buffer
	code := cli.Report(&out, "carve certs", Run(context.Background(), args, &out))
	return code, out.String()
}

func mustCerts(t *testing.T, args ...string) string {
	t.Helper()
	code, out := certs(args...)
	if code != 0 {
		t.Fatalf("carve certs %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// carve certs makes a CA and certificates whose files carry the role and
// name, and serve a real mutual TLS handshake; bad input is refused with
// a clear message and a non-zero exit.
func TestCertsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	mustCerts(t, "ca", "--dir", dir)
	mustCerts(t, "issue", "--dir", dir, "--role", "master", "--name", "m1", "--ip", "127.0.0.1", "--dns", "localhost")
	mustCerts(t, "issue", "--dir", dir, "--role", "operator", "--name", "alice")
	mustCerts(t, "issue", "--dir", dir, "--role", "agent", "--name", "agent-7", "--ip", "198.18.0.7,198.18.0.8", "--days", "30")
	for _, f := range []string{"ca.pem", "ca-key.pem", "signing.key", "signing.pub", "m1.pem", "m1-key.pem", "alice.pem", "agent-7.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	agentFiles := pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "agent-7.pem"), Key: filepath.Join(dir, "agent-7-key.pem")}
	id, err := agentFiles.Identity()
	if err != nil || id != (pki.Identity{Role: pki.RoleAgent, Name: "agent-7"}) {
		t.Errorf("agent certificate identity %v %v", id, err)
	}
	kp, err := agentFiles.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(kp.Certificates[0].Certificate[0])
	if days := time.Until(leaf.NotAfter).Hours() / 24; days < 29 || days > 31 || len(leaf.IPAddresses) != 2 {
		t.Errorf("agent certificate: %.1f days, IPs %v; want 30 days and two IPs", days, leaf.IPAddresses)
	}

	tests := []struct {
		name    string
		args    []string
		code    int
		mention string
	}{
		{"no subcommand", nil, 2, "ca, issue, rotate-signing, revoke, check-ca or check-mesh"},
		{"unknown subcommand", []string{"renew"}, 2, `"renew"`},
		{"ca without dir", []string{"ca"}, 2, "--dir is required"},
		{"ca again", []string{"ca", "--dir", dir}, 1, "file exists"},
		{"unknown role", []string{"issue", "--dir", dir, "--role", "admin", "--name", "x"}, 2, `--role: role "admin": want master, agent or operator`},
		{"bad name", []string{"issue", "--dir", dir, "--role", "agent", "--name", "no spaces"}, 2, "--name: agent id"},
		{"no name", []string{"issue", "--dir", dir, "--role", "agent"}, 2, "--name"},
		{"bad ip", []string{"issue", "--dir", dir, "--role", "agent", "--name", "a", "--ip", "198.18.0.300"}, 2, `--ip "198.18.0.300"`},
		{"bad dns", []string{"issue", "--dir", dir, "--role", "agent", "--name", "a", "--ip", "198.18.0.9", "--dns", "a b"}, 2, `--dns "a b"`},
		{"zero days", []string{"issue", "--dir", dir, "--role", "agent", "--name", "a", "--ip", "198.18.0.9", "--days", "0"}, 2, "--days 0"},
		{"days beyond the maximum", []string{"issue", "--dir", dir, "--role", "operator", "--name", "bob", "--days", "100000"}, 2, "want 1 to 825"},
		{"CA days beyond the maximum", []string{"ca", "--dir", t.TempDir(), "--days", "100000"}, 2, "want 1 to 7300"},
		{"agent without ip", []string{"issue", "--dir", dir, "--role", "agent", "--name", "a"}, 2, "needs --ip naming its underlay IP"},
		{"master without address", []string{"issue", "--dir", dir, "--role", "master", "--name", "m2"}, 2, "needs --ip"},
		{"missing CA", []string{"issue", "--dir", t.TempDir(), "--role", "agent", "--name", "a", "--ip", "198.18.0.9"}, 1, "carve certs ca"},
		{"existing files", []string{"issue", "--dir", dir, "--role", "agent", "--name", "alice", "--ip", "198.18.0.9"}, 1, `"alice" is already issued`},
		{"stray argument", []string{"issue", "--dir", dir, "extra"}, 2, `unexpected argument "extra"`},
		{"rotate-signing without dir", []string{"rotate-signing"}, 2, "--dir is required"},
		{"switch before a rotation", []string{"rotate-signing", "--dir", dir, "--switch"}, 2, "begin a rotation first"},
		{"switch and finish at once", []string{"rotate-signing", "--dir", dir, "--switch", "--finish"}, 2, "two steps"},
		{"rotate-signing without a CA", []string{"rotate-signing", "--dir", t.TempDir()}, 1, "signing.key"},
		{"finish without asking the masters", []string{"rotate-signing", "--dir", dir, "--finish"}, 2, "give --masters and an operator certificate (or --force"},
		{"check-ca without the new CA", []string{"check-ca", "--masters", "https://198.18.0.1:8080"}, 2, "--new-ca-file is required"},
		{"check-ca without masters", []string{"check-ca", "--new-ca-file", filepath.Join(dir, "ca.pem")}, 2, "--masters is required"},
		{"check-ca of a missing file", []string{"check-ca", "--new-ca-file", filepath.Join(dir, "none.pem"), "--masters", "https://198.18.0.1:8080"}, 1, "no such file"},
		{"check-ca of a leaf", []string{"check-ca", "--new-ca-file", filepath.Join(dir, "alice.pem"), "--masters", "https://198.18.0.1:8080"}, 1, `"alice" is not a CA certificate`},
		{"check-ca of a key", []string{"check-ca", "--new-ca-file", filepath.Join(dir, "ca-key.pem"), "--masters", "https://198.18.0.1:8080"}, 1, "holds no PEM certificate"},
		{"check-mesh without the password file", []string{"check-mesh", "--masters", "https://198.18.0.1:8080"}, 2, "--password-file is required"},
		{"check-mesh without masters", []string{"check-mesh", "--password-file", filepath.Join(dir, "ca.pem")}, 2, "--masters is required"},
		{"check-mesh of a missing file", []string{"check-mesh", "--password-file", filepath.Join(dir, "none.pw"), "--masters", "https://198.18.0.1:8080"}, 1, "--password-file: mesh password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := certs(tt.args...)
			if code != tt.code || !strings.Contains(out, tt.mention) {
				t.Errorf("carve certs %s: exit %d, %q; want exit %d mentioning %q", strings.Join(tt.args, " "), code, out, tt.code, tt.mention)
			}
		})
	}
	// The refused "existing files" issue left alice's certificate alone.
	if id, err := (pki.Files{Cert: filepath.Join(dir, "alice.pem"), Key: filepath.Join(dir, "alice-key.pem")}).Identity(); err != nil || id.Role != pki.RoleOperator {
		t.Errorf("alice after the refused re-issue: %v %v", id, err)
	}

	// A real handshake: the master's certificate serves, the operator's is
	// verified as a client and names its role.
	server, err := pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "m1.pem"), Key: filepath.Join(dir, "m1-key.pem")}.ServerConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: server, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := pki.PeerIdentity(r)
		_, _ = io.WriteString(w, id.String())
	})}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })
	client, err := pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "alice.pem"), Key: filepath.Join(dir, "alice-key.pem")}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: client}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatalf("mutual TLS with the issued certificates: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "operator/alice" {
		t.Errorf("the server saw the client as %q, want operator/alice", body)
	}
}
