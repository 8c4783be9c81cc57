package httpapi

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// testTLS returns a server configuration for 127.0.0.1 and a client
// configuration that trusts it, from a fresh CA.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ca := pkitest.New(t)
	return ca.ServerTLS("m1", pki.RoleMaster, false), ca.ClientTLS("", "")
}

// startServer serves handler with opts on a loopback port until the test ends.
func startServer(t *testing.T, handler http.Handler, opts ServerOptions) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if opts.ErrorLog == nil {
		opts.ErrorLog = log.New(io.Discard, "", 0)
	}
	srv := NewServer(handler, opts)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, ln.Addr().String()
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
})

// slowloris opens a connection that sends a request's headers one byte at a
// time, for ever; the returned channel is closed when the server drops it.
func slowloris(t *testing.T, addr string, tlsCfg *tls.Config, sent *atomic.Int64) <-chan struct{} {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := raw
	if tlsCfg != nil {
		cfg := tlsCfg.Clone()
		cfg.ServerName = "127.0.0.1"
		tc := tls.Client(raw, cfg)
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		conn = tc
	}
	t.Cleanup(func() { conn.Close() })
	dropped := make(chan struct{})
	go func() {
		// The server never answers a request it has not read; a read
		// returns only when it closes the connection.
		_, _ = io.Copy(io.Discard, conn)
		close(dropped)
	}()
	go func() {
		header := "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 1<<20)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-dropped:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte{header[i%len(header)]}); err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	return dropped
}

// A client that sends its headers one byte at a time is dropped when the
// header timeout expires, and other clients are served meanwhile.
func TestServerDropsSlowloris(t *testing.T) {
	serverTLS, clientTLS := testTLS(t)
	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", secure), func(t *testing.T) {
			opts := ServerOptions{ReadHeaderTimeout: 2 * time.Second, MaxConns: 8}
			scheme, ccfg := "http", (*tls.Config)(nil)
			if secure {
				opts.TLS, scheme, ccfg = serverTLS, "https", clientTLS
			}
			_, addr := startServer(t, okHandler, opts)
			var sent atomic.Int64
			var drops []<-chan struct{}
			for range 4 {
				drops = append(drops, slowloris(t, addr, ccfg, &sent))
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 10 * time.Second}
			t.Cleanup(hc.CloseIdleConnections)
			// Served while the slow clients hold their connections.
			testutil.Eventually(t, 0, "the slow clients to be sending", testutil.True(func() bool { return sent.Load() >= 8 }))
			for i := range 20 {
				resp, err := hc.Get(scheme + "://" + addr + "/")
				if err != nil {
					t.Fatalf("request %d beside the slow clients: %v", i, err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
			}
			for i, d := range drops {
				select {
				case <-d:
				case <-time.After(15 * time.Second):
					t.Fatalf("slow client %d still connected 15s after it started, header timeout 2s", i)
				}
			}
		})
	}
}

// 2,000 idle connections: the server holds at most MaxConns of them at
// once, drops each when its header timeout expires, and a real client is
// served once the backlog ahead of it has drained.
func TestServerBoundsIdleConnections(t *testing.T) {
	const idle, maxConns = 2000, 100
	srv, addr := startServer(t, okHandler, ServerOptions{ReadHeaderTimeout: 100 * time.Millisecond, IdleTimeout: 100 * time.Millisecond, MaxConns: maxConns})
	var peak atomic.Int64
	stop := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		for {
			if n := int64(srv.Conns()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range idle {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	testutil.Eventually(t, 0, "the server to hold its cap of idle connections", testutil.True(func() bool { return peak.Load() >= maxConns }))
	start := time.Now()
	resp, err := (&http.Client{Timeout: time.Minute}).Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("a client behind %d idle connections: %v", idle, err)
	}
	resp.Body.Close()
	t.Logf("served after %s behind %d idle connections", time.Since(start).Round(time.Millisecond), idle)
	close(stop)
	watcher.Wait()
	if p := peak.Load(); p > maxConns {
		t.Errorf("the server held %d connections at once, cap %d", p, maxConns)
	}
	// Every idle connection was dropped by the server, not left open.
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
			t.Fatalf("idle connection %d: read %v, want EOF (dropped by the server)", i, err)
		}
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// A handler that waits longer than the read and write timeouts (a blocking
// watch) answers when it extends its deadlines, and is cut off when it does not.
func TestServerExtendDeadlines(t *testing.T) {
	const hold = 800 * time.Millisecond
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("extend") {
			if err := ExtendDeadlines(w, hold+5*time.Second); err != nil {
				WriteError(w, http.StatusInternalServerError, "internal", err.Error())
				return
			}
		}
		select {
		case <-time.After(hold): // the watch's own wait
		case <-r.Context().Done():
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "waited"})
	})
	serverTLS, clientTLS := testTLS(t)
	_, addr := startServer(t, handler, ServerOptions{ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, TLS: serverTLS})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 30 * time.Second}
	resp, err := hc.Get("https://" + addr + "/?extend=1")
	if err != nil {
		t.Fatalf("extended watch: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "waited") {
		t.Fatalf("extended watch: %d %s", resp.StatusCode, body)
	}
	resp, err = hc.Get("https://" + addr + "/")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("a handler that outlives the write timeout without extending it answered %d %s", resp.StatusCode, body)
	}
}

// Headers beyond MaxHeaderBytes are refused.
func TestServerMaxHeaderBytes(t *testing.T) {
	_, addr := startServer(t, okHandler, ServerOptions{MaxHeaderBytes: 4 << 10})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 64<<10))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB of headers: status %d, want 431", resp.StatusCode)
	}
}
