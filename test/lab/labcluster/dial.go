package labcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
)

// nsDialer dials from inside a namespace: the socket is created by a thread
// that sits in it, and a socket stays in the namespace it was created in. The
// harness runs in the root namespace, which has no route to the lab's
// underlay (and must not send anything there: its default route leads to the
// real network), so every connection to a master or an agent goes through
// this.
func nsDialer(ns *netnslab.Namespace) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		// Only literal addresses: a name lookup would query the root
		// namespace's resolvers.
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("labcluster: dial %s: only IP literals are dialled from the lab", addr)
		}
		var conn net.Conn
		d := net.Dialer{Timeout: 5 * time.Second}
		err = ns.Do(func() error {
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// newHTTPClient returns an HTTP client whose connections start in ns, with
// the TLS configuration of https URLs.
func newHTTPClient(ns *netnslab.Namespace, tlsCfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         nsDialer(ns),
		TLSClientConfig:     tlsCfg,
		Proxy:               nil, // never through a proxy of the root namespace
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// LoopbackClient is a plain HTTP client whose connections start in the
// host's namespace, for what an agent serves on its loopback only
// (--debug-addr).
func (h *Host) LoopbackClient() *http.Client { return newHTTPClient(h.NS.Namespace, nil) }
