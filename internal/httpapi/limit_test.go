package httpapi

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// tlsRequest sends GET / on c and reads the answer's status line.
func tlsRequest(c net.Conn, br *bufio.Reader) (string, error) {
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: carve\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	return resp.Status, nil
}

// Under TLS with client certificates, idle connections without one fill
// only their share: with every slot taken the oldest of them is closed,
// so a client with a certificate, one without (a load balancer's
// /healthz) and an authenticated connection opened before the flood are
// all served, and the evictions are counted. An unauthenticated
// connection idle past UnauthenticatedTimeout is closed; an
// authenticated one is not.
func TestServerServesAuthenticatedThroughAFlood(t *testing.T) {
	const flood, maxConns = 1000, 64
	ca := pkitest.New(t)
	serverTLS := ca.ServerTLS("m1", pki.RoleMaster, false)
	srv, addr := startServer(t, okHandler, ServerOptions{MaxConns: maxConns, UnauthenticatedTimeout: 300 * time.Millisecond, TLS: serverTLS})
	dialTLS := func(cfg *tls.Config) (*tls.Conn, *bufio.Reader) {
		t.Helper()
		cfg = cfg.Clone()
		cfg.ServerName = "127.0.0.1"
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	agentTLS := ca.ClientTLS("h1", pki.RoleAgent)
	before, beforeBR := dialTLS(agentTLS)
	if st, err := tlsRequest(before, beforeBR); err != nil || st != "200 OK" {
		t.Fatalf("authenticated request before the flood: %q %v", st, err)
	}
	for i := range flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	testutil.Eventually(t, 0, "the server to close the oldest idle connections", testutil.True(func() bool {
		return srv.Evicted() >= flood-maxConns
	}))
	if n := srv.Conns(); n > maxConns {
		t.Errorf("the server holds %d connections, cap %d", n, maxConns)
	}
	for name, cfg := range map[string]*tls.Config{"with a certificate": agentTLS, "without a certificate": ca.ClientTLS("", "")} {
		c, br := dialTLS(cfg)
		if st, err := tlsRequest(c, br); err != nil || st != "200 OK" {
			t.Errorf("a client %s after %d idle connections: %q %v", name, flood, st, err)
		}
	}
	if st, err := tlsRequest(before, beforeBR); err != nil || st != "200 OK" {
		t.Errorf("the connection authenticated before the flood: %q %v", st, err)
	}
	// Idle past the unauthenticated timeout: only the connection without a
	// certificate is closed.
	anon, anonBR := dialTLS(ca.ClientTLS("", ""))
	if st, err := tlsRequest(anon, anonBR); err != nil || st != "200 OK" {
		t.Fatalf("unauthenticated request: %q %v", st, err)
	}
	_ = anon.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := anonBR.ReadByte(); err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("an idle unauthenticated connection: read %v after %s, want closed within the 300ms timeout", err, time.Since(start))
	}
	if st, err := tlsRequest(before, beforeBR); err != nil || st != "200 OK" {
		t.Errorf("the authenticated connection after an idle second: %q %v", st, err)
	}
}

// Without client certificates (a plain server) nothing is evicted: the
// cap makes new connections wait, as before.
func TestServerWithoutTLSEvictsNothing(t *testing.T) {
	srv, addr := startServer(t, okHandler, ServerOptions{MaxConns: 4})
	for i := range 8 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	testutil.Eventually(t, 0, "the server holds its cap", testutil.True(func() bool { return srv.Conns() == 4 }))
	if n := srv.Evicted(); n != 0 {
		t.Errorf("evicted %d connections of a plain server", n)
	}
}
