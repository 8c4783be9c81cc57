package gossip_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/weaveworks/mesh"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/gset"
)

// TestPeerName: an id's peer name is the first bytes of its SHA-256 (6, in
// mesh's default name flavour), the same in every process and release,
// since peers recognise one another by it; distinct ids get distinct names.
func TestPeerName(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"agent-1", "6f:f3:b3:bd:11:c4"},
		{"agent-2", "c3:54:4a:a1:58:a8"},
		{"", "e3:b0:c4:42:98:fc"},
	} {
		if got := gossip.PeerName(tc.id).String(); got != tc.want {
			t.Errorf("PeerName(%q) = %s, want %s (the first 6 bytes of its SHA-256)", tc.id, got, tc.want)
		}
	}
	const ids = 10000
	names := make(map[mesh.PeerName]string, ids)
	for i := range ids {
		id := fmt.Sprintf("agent-%d", i)
		name := gossip.PeerName(id)
		if other, ok := names[name]; ok {
			t.Fatalf("%q and %q share the peer name %s", other, id, name)
		}
		names[name] = id
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
