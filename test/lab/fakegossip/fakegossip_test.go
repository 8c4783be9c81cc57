package fakegossip

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/gset"
	"github.com/carve-net/carve/test/lab/testutil"
)

func newNetwork(t *testing.T, cfg Config) *Network {
	t.Helper()
	n := New(cfg)
	t.Cleanup(n.Close)
	return n
}

type peer struct {
	r  *Router
	h  *gset.Handler
	ch gossip.Channel
}

func join(t *testing.T, n *Network, ids ...string) []peer {
	t.Helper()
	var out []peer
	for _, id := range ids {
		r, err := n.Join(id)
		if err != nil {
			t.Fatalf("Join(%s): %v", id, err)
		}
		h := &gset.Handler{}
		ch, err := r.Channel("set", h)
		if err != nil {
			t.Fatalf("Channel: %v", err)
		}
		h.SetEcho(ch)
		out = append(out, peer{r, h, ch})
	}
	return out
}

// waitIdle waits until no message is in flight, at most testutil.WaitLimit.
func waitIdle(t *testing.T, n *Network) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.WaitLimit)
	defer cancel()
	if err := n.WaitIdle(ctx); err != nil {
		t.Fatalf("seed %d: %v", n.Seed(), err)
	}
}

func ids(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("p%02d", i))
	}
	return out
}

// TestConvergence runs a grow-only set over faulty networks: every peer adds
// its own item and broadcasts; gossip rounds repair what was lost.
func TestConvergence(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"perfect", Config{Seed: 1}},
		{"delays", Config{Seed: 2, MaxDelay: 2 * time.Millisecond}},
		{"drops", Config{Seed: 3, MaxDelay: time.Millisecond, DropRate: 0.3}},
		{"everything", Config{Seed: 4, MaxDelay: 2 * time.Millisecond, DropRate: 0.2, DuplicateRate: 0.3, ReorderRate: 0.2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNetwork(t, tt.cfg)
			peers := join(t, n, ids(12)...)
			var want []string
			for _, p := range peers {
				p.ch.Broadcast(p.h.Add("item-" + p.r.Self()))
				want = append(want, "item-"+p.r.Self())
			}
			slices.Sort(want)
			for round := 0; ; round++ {
				waitIdle(t, n)
				done := true
				for _, p := range peers {
					if !slices.Equal(p.h.Set(), want) {
						done = false
					}
				}
				if done {
					break
				}
				if round == 200 {
					t.Fatalf("seed %d: no convergence after %d gossip rounds", n.Seed(), round)
				}
				n.GossipRound()
			}
			st := n.Stats()
			if tt.cfg.DropRate > 0 && st.Dropped == 0 {
				t.Errorf("seed %d: no message dropped: %+v", n.Seed(), st)
			}
			if tt.cfg.DuplicateRate > 0 && st.Duplicated == 0 {
				t.Errorf("seed %d: no message duplicated: %+v", n.Seed(), st)
			}
			if tt.cfg.ReorderRate > 0 && st.Reordered == 0 {
				t.Errorf("seed %d: no message reordered: %+v", n.Seed(), st)
			}
		})
	}
}

func TestUnicast(t *testing.T) {
	n := newNetwork(t, Config{Seed: 5, MaxDelay: time.Millisecond})
	peers := join(t, n, "a", "b")
	if err := peers[0].ch.Unicast("b", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, n)
	if got := peers[1].h.Unicasts(); len(got) != 1 || got[0] != (gset.Unicast{From: "a", Msg: "hello"}) {
		t.Fatalf("b received %v", got)
	}
	if got := peers[0].h.Unicasts(); len(got) != 1 || got[0] != (gset.Unicast{From: "b", Msg: "re:hello"}) {
		t.Fatalf("a received %v", got)
	}
	for _, dst := range []string{"zz", "a"} {
		if err := peers[0].ch.Unicast(dst, nil); !errors.Is(err, gossip.ErrUnknownPeer) {
			t.Errorf("Unicast(%s) = %v, want ErrUnknownPeer", dst, err)
		}
	}
	if got := peers[0].r.Peers(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("Peers = %v", got)
	}
	if _, err := peers[0].r.Channel("set", &gset.Handler{}); !errors.Is(err, gossip.ErrDuplicateChannel) {
		t.Errorf("second Channel = %v", err)
	}
	if _, err := n.Join("a"); err == nil {
		t.Errorf("second Join(a) accepted")
	}
}

// TestLeave checks that a peer that left neither receives nor sends.
func TestLeave(t *testing.T) {
	n := newNetwork(t, Config{Seed: 6})
	peers := join(t, n, "a", "b", "c")
	n.Leave("c")
	peers[0].ch.Broadcast(peers[0].h.Add("x"))
	peers[2].ch.Broadcast(peers[2].h.Add("from-c"))
	if err := peers[2].ch.Unicast("a", []byte("hi")); !errors.Is(err, gossip.ErrStopped) {
		t.Fatalf("Unicast from a departed peer = %v", err)
	}
	waitIdle(t, n)
	if got := peers[2].h.Set(); !slices.Equal(got, []string{"from-c"}) {
		t.Fatalf("departed peer received %v", got)
	}
	if got := peers[1].h.Set(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("b has %v", got)
	}
	if err := peers[0].ch.Unicast("c", nil); !errors.Is(err, gossip.ErrUnknownPeer) {
		t.Fatalf("Unicast to a departed peer = %v", err)
	}
}

// TestSeedReplays checks that a seed fixes the fault pattern of a link.
func TestSeedReplays(t *testing.T) {
	arrived := func(seed uint64) []string {
		n := newNetwork(t, Config{Seed: seed, DropRate: 0.5, DuplicateRate: 0.3})
		peers := join(t, n, "a", "b")
		peers[1].h.SetEcho(nil)
		for i := range 64 {
			if err := peers[0].ch.Unicast("b", []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		waitIdle(t, n)
		var got []string
		for _, u := range peers[1].h.Unicasts() {
			got = append(got, u.Msg)
		}
		slices.Sort(got)
		return got
	}
	a, b, c := arrived(42), arrived(42), arrived(43)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 42 gave different deliveries:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 gave the same deliveries")
	}
}

// TestPeriodicGossip checks that the network gossips by itself when given an
// interval, repairing a lost broadcast.
func TestPeriodicGossip(t *testing.T) {
	n := newNetwork(t, Config{Seed: 7, GossipInterval: time.Millisecond})
	peers := join(t, n, "a", "b")
	peers[0].h.Add("x") // never broadcast: only periodic gossip carries it
	testutil.Eventually(t, 0, fmt.Sprintf("seed %d: periodic gossip arrives", n.Seed()), testutil.True(func() bool {
		return slices.Equal(peers[1].h.Set(), []string{"x"})
	}))
}

// TestConnectForget: the addresses a router was given, and forgot, are
// kept as mesh keeps them.
func TestConnectForget(t *testing.T) {
	n := newNetwork(t, Config{Seed: 8})
	peers := join(t, n, "a")
	r := peers[0].r
	if err := r.Connect("198.18.0.1:6783", "198.18.0.2:6783", "198.18.0.3:6783"); err != nil {
		t.Fatal(err)
	}
	if err := r.Forget("198.18.0.2:6783", "198.18.0.9:6783"); err != nil {
		t.Fatal(err)
	}
	if got, want := r.Targets(), []string{"198.18.0.1:6783", "198.18.0.3:6783"}; !slices.Equal(got, want) {
		t.Fatalf("Targets = %v, want %v", got, want)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Connect("198.18.0.4:6783"); !errors.Is(err, gossip.ErrStopped) {
		t.Errorf("Connect after Stop = %v", err)
	}
	if err := r.Forget("198.18.0.1:6783"); !errors.Is(err, gossip.ErrStopped) {
		t.Errorf("Forget after Stop = %v", err)
	}
}
