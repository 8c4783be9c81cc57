package master

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// Clients without a certificate that complete a handshake, send one
// request and idle hold only their share of the leader's
// --max-connections (issue 26: with 300, 320 of them made an operator's
// /healthz fail, and none was evicted): an operator's request to the
// leader and a write forwarded by a follower are served after the flood,
// and the evictions are counted. Before the fix the masters' TLS
// configuration (chosen per handshake, to reload the files) counted every
// connection as authenticated: the flood held every slot and both waited
// in the leader's backlog until their deadline.
func TestLeaderServesThroughAnIdleFloodWithoutCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	const maxConns = 24
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p, func(o *Options) { o.HTTPServer.MaxConns = maxConns })
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	anon := p.ClientTLS("", "")
	anon.ServerName = "127.0.0.1"
	for i := range 2 * maxConns {
		if err := healthzThenIdle(t, c.httpAddrs[leader], anon); err != nil {
			t.Errorf("client without a certificate %d (GET /healthz, then idle): %v: the leader holds the earlier ones beyond their share", i, err)
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.onlyClient(leader).ClusterStatus(ctx); err != nil {
		t.Errorf("an operator's request to the leader after the flood: %v", err)
	}
	if _, err := c.onlyClient(follower).Register(ctx, api.RegisterRequest{AgentID: "after-flood", IP: "198.18.0.77"}); err != nil {
		t.Errorf("a write forwarded by follower %s after the flood: %v", c.ids[follower], err)
	}
	if n := c.masters[leader].httpSrv.Evicted(); n == 0 {
		t.Error("the leader evicted no connection without a certificate")
	}
	if n := c.masters[leader].HTTPConns(); n > maxConns {
		t.Errorf("the leader holds %d connections, cap %d", n, maxConns)
	}
}

// healthzThenIdle opens a TLS connection to addr with cfg, sends GET
// /healthz, reads the answer and leaves the connection open until the
// test ends.
func healthzThenIdle(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	t.Cleanup(func() { raw.Close() })
	// Bounds the wait of a connection the leader does not take.
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	conn := tls.Client(raw, cfg)
	if _, err := fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: carve\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}
