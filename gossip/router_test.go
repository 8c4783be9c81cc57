package gossip_test

import (
	"errors"
	"testing"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/gossip/internal/gset"
)

func TestPeerName(t *testing.T) {
	if gossip.PeerName("agent-1") != gossip.PeerName("agent-1") {
		t.Fatal("PeerName is not deterministic")
	}
	if gossip.PeerName("agent-1") == gossip.PeerName("agent-2") {
		t.Fatal("two ids share a peer name")
	}
}

func newUnstarted(t *testing.T, id string) *gossip.MeshRouter {
	t.Helper()
	r, err := gossip.NewMeshRouter(gossip.MeshConfig{ID: id, Host: "127.0.0.1", Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMeshRouterErrors(t *testing.T) {
	if _, err := gossip.NewMeshRouter(gossip.MeshConfig{}); err == nil {
		t.Fatal("NewMeshRouter accepted an empty id")
	}
	r := newUnstarted(t, "a")
	if r.Self() != "a" {
		t.Fatalf("Self = %q", r.Self())
	}
	if _, err := r.Channel("c", &gset.Handler{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Channel("c", &gset.Handler{}); !errors.Is(err, gossip.ErrDuplicateChannel) {
		t.Fatalf("second Channel = %v", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); !errors.Is(err, gossip.ErrStopped) {
		t.Fatalf("Start after Stop = %v", err)
	}
	if err := r.Connect("127.0.0.1:1"); !errors.Is(err, gossip.ErrStopped) {
		t.Fatalf("Connect after Stop = %v", err)
	}
}
