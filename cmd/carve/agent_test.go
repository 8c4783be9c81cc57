package main

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/pki"
)

// TestAgentRefusesToStartInsecure: without credentials, with the wrong ones,
// or with masters whose scheme does not match them, `carve agent` stops at
// once with a message naming what is wrong, before it creates anything.
func TestAgentRefusesToStartInsecure(t *testing.T) {
	ca := t.TempDir()
	if err := pki.CreateCA(ca, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, req := range []pki.IssueRequest{
		{Role: pki.RoleAgent, Name: "h1", IPs: []netip.Addr{netip.MustParseAddr("198.18.0.11")}},
		{Role: pki.RoleOperator, Name: "op"},
		{Role: pki.RoleMaster, Name: "m1"},
	} {
		if err := pki.Issue(ca, req); err != nil {
			t.Fatal(err)
		}
	}
	password := filepath.Join(ca, "mesh-password")
	if err := os.WriteFile(password, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(ca, "empty-password")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certOf := func(name string) []string {
		return []string{"--cert-file", pki.CertFile(ca, name), "--key-file", pki.KeyFile(ca, name)}
	}
	caFlag := []string{"--ca-file", filepath.Join(ca, pki.CAFile)}
	meshFlag := []string{"--mesh-password-file", password}
	const httpMaster, httpsMaster = "http://127.0.0.1:1", "https://127.0.0.1:1"
	join := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}

	tests := []struct {
		name     string
		masters  string
		args     []string
		want     []string // substrings of the error
		insecure bool     // the error wraps agent.ErrInsecure
	}{
		{"no credentials", httpMaster, nil,
			[]string{"no TLS credentials", "--ca-file", "--cert-file", "--key-file", "--insecure"}, true},
		{"no mesh password", httpsMaster, join(caFlag, certOf("h1")),
			[]string{"no mesh password", "--mesh-password-file", "--insecure"}, true},
		{"empty mesh password", httpsMaster, join(caFlag, certOf("h1"), []string{"--mesh-password-file", empty}),
			[]string{"--mesh-password-file", empty, "is empty"}, false},
		{"certificate without CA", httpsMaster, join(certOf("h1"), meshFlag),
			[]string{"--ca-file"}, false},
		{"CA without certificate", httpsMaster, join(caFlag, meshFlag),
			[]string{"--cert-file", "--key-file"}, false},
		{"operator certificate", httpsMaster, join(caFlag, certOf("op"), meshFlag),
			[]string{pki.CertFile(ca, "op"), "operator/op", "not an agent's", "--role agent"}, false},
		{"master certificate", httpsMaster, join(caFlag, certOf("m1"), meshFlag),
			[]string{"master/m1", "not an agent's"}, false},
		{"--id differs from the certificate", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--id", "h2"}),
			[]string{`--id "h2"`, `agent id "h1"`, pki.CertFile(ca, "h1")}, false},
		{"https master without credentials", httpsMaster, meshFlag,
			[]string{httpsMaster, "is https", "--ca-file", "--cert-file", "--key-file"}, false},
		{"https master without credentials, --insecure", httpsMaster, join(meshFlag, []string{"--insecure"}),
			[]string{httpsMaster, "is https", "--ca-file"}, false},
		{"http master with TLS files", httpMaster, join(caFlag, certOf("h1"), meshFlag),
			[]string{httpMaster, "plain http", "https://", "--insecure"}, true},
		{"masters of both schemes", httpsMaster + "," + httpMaster, join(caFlag, certOf("h1"), meshFlag),
			[]string{"mixes https", httpMaster}, false},
		{"missing key file", httpsMaster, join(caFlag, []string{"--cert-file", pki.CertFile(ca, "h1"), "--key-file", filepath.Join(ca, "absent.pem")}, meshFlag),
			[]string{"--cert-file/--key-file", "absent.pem"}, false},
		{"signing key missing", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--signing-pub-file", filepath.Join(ca, "absent.pub")}),
			[]string{"--signing-pub-file", "absent.pub"}, false},
		{"signing key file of another kind", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--signing-pub-file", filepath.Join(ca, pki.CAFile)}),
			[]string{"--signing-pub-file " + filepath.Join(ca, pki.CAFile), "not a PEM public key"}, false},
		{"mesos CNI dir is the CNI dir", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--cni-conf-dir", "/etc/cni/net.d", "--mesos-cni-conf-dir", "/etc/cni/net.d/"}),
			[]string{"--mesos-cni-conf-dir /etc/cni/net.d/ is --cni-conf-dir"}, false},
		{"docker network name without the overlay", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--docker-network-name", "dcos"}),
			[]string{"--docker-network-name", `"dcos"`, "{overlay}"}, false},
		{"docker network name Docker refuses", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--docker-network-name", "net/{overlay}"}),
			[]string{"--docker-network-name", "not a Docker network name"}, false},
		{"CNI version carve does not write", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--cni-version", "0.3.1"}),
			[]string{"--cni-version", `"0.3.1"`, "0.4.0 (libcni 0.7/0.8: containerd 1.3-1.5, Podman 2-3", "1.0.0 (libcni 1.0/1.1: containerd 1.6-1.7, Podman 4", "1.1.0 (adds STATUS and GC", "or auto"}, false},
		{"unknown socket group", httpsMaster, join(caFlag, certOf("h1"), meshFlag, []string{"--socket-group", "no-such-carve-group"}),
			[]string{"--socket-group", "no-such-carve-group"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			args := append([]string{"--data-dir", dataDir, "--masters", tt.masters, "--ip", "198.18.0.11",
				"--log-level", "error"}, tt.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := runAgent(ctx, args)
			if err == nil {
				t.Fatalf("carve agent %s started", strings.Join(args, " "))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			t.Logf("carve agent: %v", err)
			if got := errors.Is(err, agent.ErrInsecure); got != tt.insecure {
				t.Errorf("errors.Is(%v, ErrInsecure) = %v, want %v", err, got, tt.insecure)
			}
			if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
				t.Errorf("the refused agent created its data dir (%v)", err)
			}
		})
	}
}
