// Package meshtest starts real mesh routers on 127.0.0.1 for tests of what
// runs on them (membership, rings). mesh has data races the race detector
// reports, so tests that use it carry the !race build tag.
package meshtest

import (
	"fmt"
	"net"
	"testing"

	"github.com/carve-net/carve/gossip"
)

// Start starts a mesh router for id on a free port of 127.0.0.1, with
// cfg's other settings; register adds its channels before it starts (mesh
// needs them first). The router stops at the end of the test. It returns
// the router and its address.
func Start(t testing.TB, id string, cfg gossip.MeshConfig, register func(r *gossip.MeshRouter) error) (*gossip.MeshRouter, string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cfg.ID, cfg.Host, cfg.Port = id, "127.0.0.1", port
		r, err := gossip.NewMeshRouter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := register(r); err != nil {
			t.Fatal(err)
		}
		if err := r.Start(); err != nil {
			if attempt < 5 {
				continue // the port was taken meanwhile
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop() })
		return r, fmt.Sprintf("127.0.0.1:%d", port)
	}
}
