package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/certscmd"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
	"github.com/carve-net/carve/test/lab/testutil"
)

// certs runs carve certs with args and returns its exit code and output
// (what main would print on stdout and stderr).
func certs(args ...string) (int, string) {
	var out bytes.Buffer
	code := cli.Report(&out, "carve certs", certscmd.Run(context.Background(), args, &out))
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
