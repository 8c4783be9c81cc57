package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// A server whose VerifyConnection is wrapped by RefuseRevoked refuses a
// client certificate on the deny list at the handshake, counts it, and
// still applies the wrapped check; one not on the list passes.
func TestRefuseRevoked(t *testing.T) {
	dir := newCA(t)
	agentCert, err := ReadCertificate(filepath.Join(dir, "agent-1.pem"))
	if err != nil {
		t.Fatal(err)
	}
	revoked := map[string]bool{Serial(agentCert): true}
	var refused atomic.Int64
	srvCfg, err := files(dir, "m1").ServerConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg.VerifyConnection = RefuseRevoked(RequireRole(RoleMaster, RoleAgent), func(s string) bool { return revoked[s] }, func() { refused.Add(1) })
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	serverErrs := serveHandshakes(t, ln)
	for _, tc := range []struct {
		name string
		want error // of the server's handshake
	}{{"m1", nil}, {"agent-1", ErrRevoked}, {"alice", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := files(dir, tc.name).ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			if c, err := tls.Dial("tcp", ln.Addr().String(), cfg); err == nil {
				_, _ = io.ReadAll(c)
				c.Close()
			}
			err = <-serverErrs
			if tc.name == "alice" {
				// An operator: refused by the wrapped role check, not as revoked.
				if err == nil || errors.Is(err, ErrRevoked) {
					t.Fatalf("handshake as alice: %v, want the role check's refusal", err)
				}
				return
			}
			if !errors.Is(err, tc.want) && (tc.want != nil || err != nil) {
				t.Fatalf("handshake as %s: %v, want %v", tc.name, err, tc.want)
			}
		})
	}
	if got := refused.Load(); got != 1 {
		t.Errorf("refusals counted %d, want 1", got)
	}
}

// serveHandshakes accepts TLS connections on ln until the test ends: each
// does its handshake, writes "ok" when it passed, and the handshake's
// error is sent on the returned channel when there is room.
func serveHandshakes(t *testing.T, ln net.Listener) <-chan error {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	errs := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				err := c.(*tls.Conn).Handshake()
				select {
				case errs <- err:
				default:
				}
				if err == nil {
					_, _ = c.Write([]byte("ok"))
				}
			}()
		}
	}()
	return errs
}
