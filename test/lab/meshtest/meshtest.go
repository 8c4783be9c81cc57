// Package meshtest starts real mesh routers on 127.0.0.1 for tests of what
// runs on them (membership, rings). mesh has data races the race detector
// reports, so tests that use it carry the !race build tag.
package meshtest

import (
	"fmt"
	"net"
	"sync/atomic"
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

// Deaf wraps a channel handler that drops everything it receives while
// deaf is set (its own gossip still goes out): one side of a partition.
func Deaf(h gossip.Handler, deaf *atomic.Bool) gossip.Handler { return deafHandler{h, deaf} }

type deafHandler struct {
	gossip.Handler
	deaf *atomic.Bool
}

func (d deafHandler) OnGossip(msg []byte) (gossip.Data, error) {
	if d.deaf.Load() {
		return nil, nil
	}
	return d.Handler.OnGossip(msg)
}

func (d deafHandler) OnBroadcast(src string, msg []byte) (gossip.Data, error) {
	if d.deaf.Load() {
		return nil, nil
	}
	return d.Handler.OnBroadcast(src, msg)
}

func (d deafHandler) OnUnicast(src string, msg []byte) error {
	if d.deaf.Load() {
		return nil
	}
	return d.Handler.OnUnicast(src, msg)
}
