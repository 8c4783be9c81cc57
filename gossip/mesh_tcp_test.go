//go:build !race

// Real mesh routers over TCP on 127.0.0.1. mesh has data races the race
// detector reports, so these run only without -race.

package gossip_test

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/gset"
	"github.com/carve-net/carve/test/lab/testutil"
)

type meshPeer struct {
	r    *gossip.MeshRouter
	h    *gset.Handler
	ch   gossip.Channel
	addr string
	// refused counts the handshakes refused for the password.
	refused *atomic.Int64
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startPeer starts a router with a "set" channel on a free loopback port.
func startPeer(t *testing.T, id string, password []byte, log *slog.Logger) meshPeer {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	refused := &atomic.Int64{}
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		r, err := gossip.NewMeshRouter(gossip.MeshConfig{
			ID: id, Host: "127.0.0.1", Port: port, Password: password,
			GossipInterval:    50 * time.Millisecond,
			Logger:            log,
			OnPasswordRefused: func() { refused.Add(1) },
		})
		if err != nil {
			t.Fatal(err)
		}
		h := &gset.Handler{}
		ch, err := r.Channel("set", h)
		if err != nil {
			t.Fatal(err)
		}
		h.SetEcho(ch)
		if err := r.Start(); err != nil {
			if attempt < 5 {
				continue // the port was taken meanwhile
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop() })
		return meshPeer{r, h, ch, fmt.Sprintf("127.0.0.1:%d", port), refused}
	}
}

// startMesh starts n routers with a "set" channel each and connects them in
// a chain, so that the rest is found by discovery.
func startMesh(t *testing.T, n int) []meshPeer {
	t.Helper()
	var peers []meshPeer
	for i := range n {
		p := startPeer(t, fmt.Sprintf("agent-%d", i), nil, nil)
		if i > 0 {
			if err := p.r.Connect(peers[i-1].addr); err != nil {
				t.Fatal(err)
			}
		}
		peers = append(peers, p)
	}
	testutil.Eventually(t, 0, "the mesh forms", func() error {
		for _, p := range peers {
			if got := p.r.Peers(); len(got) != n-1 {
				return fmt.Errorf("%s knows %v", p.r.Self(), got)
			}
		}
		return nil
	})
	return peers
}

func TestMeshBroadcastGossipUnicast(t *testing.T) {
	peers := startMesh(t, 3)
	if got := peers[0].r.Peers(); !slices.Equal(got, []string{"agent-1", "agent-2"}) {
		t.Fatalf("Peers = %v", got)
	}
	// Broadcast.
	peers[0].ch.Broadcast(peers[0].h.Add("b0"))
	// Periodic gossip only (never broadcast).
	peers[2].h.Add("g2")
	want := []string{"b0", "g2"}
	for _, p := range peers {
		testutil.Eventually(t, 0, p.r.Self()+" has "+fmt.Sprint(want), testutil.True(func() bool { return slices.Equal(p.h.Set(), want) }))
	}
	// Periodic gossip may bring b0 before the broadcast does.
	testutil.Eventually(t, 0, "agent-1 received agent-0's broadcast", func() error {
		if src := peers[1].h.BroadcastSources(); !slices.Contains(src, "agent-0") {
			return fmt.Errorf("broadcast sources seen by agent-1 = %v", src)
		}
		return nil
	})
	// Unicast across the chain (agent-0 to agent-2), answered.
	if err := peers[0].ch.Unicast("agent-2", []byte("ping")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the answer", testutil.True(func() bool { return len(peers[0].h.Unicasts()) == 1 }))
	if got := peers[2].h.Unicasts(); len(got) != 1 || got[0] != (gset.Unicast{From: "agent-0", Msg: "ping"}) {
		t.Fatalf("agent-2 received %v", got)
	}
	if got := peers[0].h.Unicasts()[0]; got != (gset.Unicast{From: "agent-2", Msg: "re:ping"}) {
		t.Fatalf("agent-0 received %v", got)
	}
	if _, err := peers[0].r.Channel("late", &gset.Handler{}); err == nil {
		t.Fatal("Channel after Start accepted")
	}
}

func TestMeshStartTwiceOnOnePort(t *testing.T) {
	port := freePort(t)
	a, _ := gossip.NewMeshRouter(gossip.MeshConfig{ID: "a", Host: "127.0.0.1", Port: port})
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop() })
	b, _ := gossip.NewMeshRouter(gossip.MeshConfig{ID: "b", Host: "127.0.0.1", Port: port})
	if err := b.Start(); err == nil {
		t.Fatal("second router on the same port started")
	}
}
