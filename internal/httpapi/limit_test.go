package httpapi

import (
	"bufio"
	"crypto/tls"
	"errors"
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

// handshake opens a TLS connection to addr (a server on 127.0.0.1) with
// cfg, its reads and writes bounded by within, closed when the test ends.
func handshake(t *testing.T, addr string, cfg *tls.Config, within time.Duration) (*tls.Conn, *bufio.Reader, error) {
	t.Helper()
	cfg = cfg.Clone()
	cfg.ServerName = "127.0.0.1"
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { raw.Close() })
	_ = raw.SetDeadline(time.Now().Add(within))
	c := tls.Client(raw, cfg)
	if err := c.Handshake(); err != nil {
		return nil, nil, err
	}
	return c, bufio.NewReader(c), nil
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

// Under TLS with client certificates, when authenticated connections hold
// every slot, the next connection is reset at once (counted as shed): its
// client tries another master rather than wait in the backlog for its
// handshake timeout. Once one of them closes, the next is served.
func TestServerTurnsAwayConnectionsBeyondAFullCap(t *testing.T) {
	const maxConns = 4
	ca := pkitest.New(t)
	srv, addr := startServer(t, okHandler, ServerOptions{MaxConns: maxConns, IdleTimeout: 10 * time.Minute,
		UnauthenticatedTimeout: 10 * time.Minute, TLS: ca.ServerTLS("m1", pki.RoleMaster, false)})
	agentTLS := ca.ClientTLS("h1", pki.RoleAgent)
	// 30 s: far beyond a reset; only a connection left in the backlog meets it.
	dial := func() (*tls.Conn, *bufio.Reader, error) { return handshake(t, addr, agentTLS, 30*time.Second) }
	var held []*tls.Conn
	for i := range maxConns {
		c, br, err := dial()
		if err == nil {
			var st string
			if st, err = tlsRequest(c, br); err == nil && st != "200 OK" {
				err = fmt.Errorf("status %q", st)
			}
		}
		if err != nil {
			t.Fatalf("authenticated connection %d of the cap: %v (shed %d, evicted %d, held %d)", i, err, srv.Shed(), srv.Evicted(), srv.Conns())
		}
		held = append(held, c)
	}
	c, br, err := dial()
	if err == nil {
		_, err = tlsRequest(c, br)
	}
	var ne net.Error
	switch {
	case err == nil:
		t.Fatalf("a connection beyond a cap of %d authenticated ones was served", maxConns)
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("a connection beyond the cap waited (%v): it should be turned away at once", err)
	}
	if n := srv.Shed(); n == 0 {
		t.Errorf("turned away a connection (%v) but counted none shed", err)
	}
	if n := srv.Evicted(); n != 0 {
		t.Errorf("evicted %d connections: every one held was authenticated", n)
	}
	held[0].Close()
	testutil.Eventually(t, 0, "a connection served once one of the cap closed", func() error {
		c, br, err := dial()
		if err != nil {
			return err
		}
		st, err := tlsRequest(c, br)
		if err == nil && st != "200 OK" {
			err = fmt.Errorf("status %q", st)
		}
		return err
	})
}

// Without client certificates (a plain server) nothing is evicted or
// turned away: the cap makes new connections wait, as before.
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
	if n := srv.Shed(); n != 0 {
		t.Errorf("turned away %d connections of a plain server", n)
	}
}

// Clients without a certificate keep to their share of the cap however
// they behave: connections that complete a handshake, send one request
// and idle (their timeout set far beyond the test, so only the share can
// free a slot), and connections that stall mid-handshake. A client with
// a certificate (an operator, or a master forwarding a write) is served
// after the flood, under the configuration the masters and agents serve
// with (pki.Reloader's, chosen per handshake) as under a fixed one.
// Before the fix the Reloader's configuration, whose outer ClientAuth is
// NoClientCert, counted every connection as authenticated: the flood held
// every slot and the client with a certificate waited in the backlog.
func TestServerShareHoldsWhateverClientsWithoutACertificateDo(t *testing.T) {
	const maxConns = 16
	ca := pkitest.New(t)
	files := ca.Files("m1", pki.RoleMaster)
	reloader, err := pki.NewReloader(files)
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := files.ServerConfig(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{
		{"reloaded files", reloader.ServerConfig(false)},
		{"fixed files", fixed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, addr := startServer(t, okHandler, ServerOptions{MaxConns: maxConns,
				UnauthenticatedTimeout: 10 * time.Minute, IdleTimeout: 10 * time.Minute, ReadHeaderTimeout: 10 * time.Minute, TLS: tc.tls})
			// 5 s bounds the wait of a connection the server does not take.
			dial := func(cfg *tls.Config) (*tls.Conn, *bufio.Reader, error) { return handshake(t, addr, cfg, 5*time.Second) }
			anonTLS := ca.ClientTLS("", "")
			for i := range 3 * maxConns {
				c, br, err := dial(anonTLS)
				if err == nil {
					var st string
					if st, err = tlsRequest(c, br); err == nil && st != "200 OK" {
						err = fmt.Errorf("status %q", st)
					}
				}
				if err != nil {
					t.Errorf("client without a certificate %d (a request, then idle): %v: the server holds the earlier ones beyond their share", i, err)
					break
				}
			}
			for i := range maxConns {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatalf("stalled handshake %d: %v", i, err)
				}
				t.Cleanup(func() { c.Close() })
				// A TLS record header announcing a ClientHello that never comes.
				if _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00}); err != nil {
					t.Fatalf("stalled handshake %d: %v", i, err)
				}
			}
			for name, cfg := range map[string]*tls.Config{
				"operator":                  ca.ClientTLS("operator", pki.RoleOperator),
				"master forwarding a write": ca.ClientTLS("m2", pki.RoleMaster),
			} {
				c, br, err := dial(cfg)
				if err == nil {
					var st string
					if st, err = tlsRequest(c, br); err == nil && st != "200 OK" {
						err = fmt.Errorf("status %q", st)
					}
				}
				if err != nil {
					t.Errorf("%s after the flood: %v (the server holds %d connections, evicted %d)", name, err, srv.Conns(), srv.Evicted())
				}
			}
			if n := srv.Conns(); n > maxConns {
				t.Errorf("the server holds %d connections, cap %d", n, maxConns)
			}
			if srv.Evicted() == 0 {
				t.Error("no connection without a certificate was evicted")
			}
		})
	}
}
