package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
	"github.com/carve-net/carve/test/lab/testutil"
)

// certs runs carve certs with args and returns its exit code and output
// (what main would print on stdout and stderr).
func certs(args ...string) (int, string) {
	var out bytes.Buffer
	code := cli.Report(&out, "carve certs", runCerts(context.Background(), args, &out))
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

// freePort returns a loopback address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A master started by carve master with certificates from carve certs
// serves carve state to an operator's certificate, over TLS only; the
// commands refuse missing or contradictory security flags.
func TestSecureMasterAndState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master")
	}
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	mustCerts(t, "ca", "--dir", pkiDir)
	mustCerts(t, "issue", "--dir", pkiDir, "--role", "master", "--name", "m1", "--ip", "127.0.0.1")
	mustCerts(t, "issue", "--dir", pkiDir, "--role", "operator", "--name", "op")
	ca, file := filepath.Join(pkiDir, "ca.pem"), func(n string) string { return filepath.Join(pkiDir, n) }
	httpAddr, raftAddr := freePort(t), freePort(t)
	base := []string{"--id", "m1", "--data-dir", filepath.Join(dir, "m1"), "--http-addr", httpAddr, "--raft-addr", raftAddr,
		"--peers", "m1=" + raftAddr, "--log-level", "warn"}
	secure := []string{"--ca-file", ca, "--cert-file", file("m1.pem"), "--key-file", file("m1-key.pem"), "--signing-key-file", file("signing.key")}

	refused := []struct {
		name, mention string
		args          []string
	}{
		{"no TLS and no --insecure", "--ca-file, --cert-file, --key-file (or --insecure", base},
		{"--insecure beside TLS", "--insecure contradicts", append(append([]string{"--insecure"}, base...), secure...)},
		{"no signing key", "--signing-key-file is required", append(append([]string{}, base...), secure[:6]...)},
	}
	for _, tt := range refused {
		err := runMaster(context.Background(), tt.args)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("carve master, %s: %v; want a usage error mentioning %q", tt.name, err, tt.mention)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runMaster(ctx, append(append([]string{}, base...), secure...)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("carve master: %v", err)
		}
	})

	stateArgs := []string{"--masters", httpAddr, "--json", "--ca-file", ca, "--cert-file", file("op.pem"), "--key-file", file("op-key.pem")}
	var st api.State
	testutil.Eventually(t, 0, "carve state to read the secure master", func() error {
		var out bytes.Buffer
		if err := runState(context.Background(), stateArgs, &out); err != nil {
			return err
		}
		st = api.State{}
		if err := json.Unmarshal(out.Bytes(), &st); err != nil {
			return err
		}
		if st.ClusterID == "" || st.SigningKey == "" {
			return errors.New("cluster id or signing key not there yet")
		}
		return nil
	})
	pub, err := pki.LoadVerifyKey(file("signing.pub"))
	if err != nil || st.SigningKey != api.EncodeSigningKey(pub) {
		t.Errorf("state signing_key %q is not signing.pub (%v)", st.SigningKey, err)
	}

	stateRefused := []struct {
		name, mention string
		code          int
		args          []string
	}{
		{"no TLS flags", "--ca-file, --cert-file, --key-file (or --insecure", 2, []string{"--masters", httpAddr}},
		{"no certificate", "--cert-file, --key-file", 2, []string{"--masters", httpAddr, "--ca-file", ca}},
		{"http URL with TLS", "must be https://", 2, append([]string{"--masters", "http://" + httpAddr}, stateArgs[3:]...)},
		{"--insecure against TLS", "--ca-file", 1, []string{"--masters", "https://" + httpAddr, "--insecure"}},
	}
	for _, tt := range stateRefused {
		err := runState(context.Background(), tt.args, io.Discard)
		if cli.ExitCode(err) != tt.code || err == nil || !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("carve state, %s: %v (exit %d); want exit %d mentioning %q", tt.name, err, cli.ExitCode(err), tt.code, tt.mention)
		}
	}
}

// TestMasterOwnAddressesChecked (issue 27, item 7): carve master (and so
// --check-config) refuses an own --peers entry that is not --raft-addr, and
// a loopback --raft-addr or --http-addr (an empty CARVE_RAFT_ADDR: the
// default) beside peers on other hosts; a one-host lab on loopback passes.
func TestMasterOwnAddressesChecked(t *testing.T) {
	peers := func(s string) []raftlog.Server {
		t.Helper()
		p, err := parsePeers(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tt := range []struct {
		name, raft, http, peers, mention string
	}{
		{"own entry differs", "198.18.0.1:8300", "198.18.0.1:8080", "m1=198.18.0.9:8300,m2=198.18.0.2:8300", "--peers gives this master (m1) the address 198.18.0.9:8300"},
		{"empty CARVE_RAFT_ADDR", "127.0.0.1:8300", "198.18.0.1:8080", "m1=127.0.0.1:8300,m2=198.18.0.2:8300", "--raft-addr (CARVE_RAFT_ADDR) is 127.0.0.1:8300, a loopback address"},
		{"loopback API", "198.18.0.1:8300", "localhost:8080", "m1=198.18.0.1:8300,m2=198.18.0.2:8300", "--http-addr (CARVE_HTTP_ADDR) is localhost:8080"},
		{"a lab on loopback", "127.0.0.1:8300", "127.0.0.1:8080", "m1=127.0.0.1:8300,m2=127.0.0.1:8301", ""},
		{"a real cluster", "198.18.0.1:8300", "198.18.0.1:8080", "m1=198.18.0.1:8300,m2=198.18.0.2:8300", ""},
	} {
		err := checkOwnAddresses("m1", tt.raft, tt.http, peers(tt.peers))
		switch {
		case tt.mention == "" && err != nil:
			t.Errorf("%s: %v, want no error", tt.name, err)
		case tt.mention != "" && (cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tt.mention)):
			t.Errorf("%s: %v, want a usage error mentioning %q", tt.name, err, tt.mention)
		}
	}
}
