package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// TestGossipWithoutMasters: a change seen by some agents reaches an agent
// that missed it through mesh gossip alone, with every master down.
//
// Host 4's agent is stopped; meanwhile the masters gain an agent ("late", a
// registration only) and lose one (host 3's). Then every master stops and
// host 4's agent starts again: its disk knows neither change and no master
// answers, so only the other agents, over real weaveworks/mesh between real
// processes, can tell it to program "late" and to remove host 3 (the
// tombstone wins over its older record).
func TestGossipWithoutMasters(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 4, Masters: 3, Prefix: prefix})
	ctx := within(t, 2*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h3, h4 := c.Host(3), c.Host(4)
	h3ID := h3.AgentID()
	h3Entries := entriesAtMasters(ctx, t, c, h3ID)
	if err := c.StopAgent(ctx, h4); err != nil {
		t.Fatal(err)
	}

	// The changes host 4 misses: one agent joins, one is deleted.
	late := register(ctx, t, c, api.RegisterRequest{AgentID: "late", IP: "198.18.2.50", MeshAddr: "198.18.2.50:6783"})
	lateEntries := entriesAtMasters(ctx, t, c, "late")
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if err := c.Client().DeleteAgent(ctx, h3ID); err != nil {
		t.Fatal(err)
	}
	// The agents still running (hosts 1 and 2) have seen both.
	for _, h := range []*labcluster.Host{c.Host(1), c.Host(2)} {
		if err := retry.Until(ctx, 100*time.Millisecond, func() error {
			return peerState(ctx, c, h, "late", h3ID)
		}); err != nil {
			t.Fatalf("%s before the masters stop: %v", h.Name, err)
		}
	}

	for _, m := range c.Masters() {
		if err := c.StopMaster(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.StartAgent(h4); err != nil {
		t.Fatal(err)
	}
	err := retry.Until(ctx, 100*time.Millisecond, func() error {
		if err := peerState(ctx, c, h4, "late", h3ID); err != nil {
			return err
		}
		ks, err := c.Kernel(h4)
		if err != nil {
			return err
		}
		if err := ks.HasPeer(lateEntries); err != nil {
			return fmt.Errorf("late not in host 4's kernel: %w", err)
		}
		if err := ks.LacksPeer(h3Entries); err != nil {
			return fmt.Errorf("deleted host 3 still in host 4's kernel: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("host 4, restarted with every master down, did not learn through gossip: %v", err)
	}
	peers, err := c.AgentClient(h4).Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if peers.MastersReachable {
		t.Errorf("host 4 reports the masters reachable while every master is stopped")
	}
	if late.Version == 0 {
		t.Errorf("late registered without a version")
	}
}

// peerState checks an agent's membership: joined is programmed, and left is
// gone with its tombstone.
func peerState(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, joined, left string) error {
	peers, err := c.AgentClient(h).Peers(ctx)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(peers.Peers, func(p api.AgentPeer) bool { return p.AgentID == joined && p.Programmed }) {
		return fmt.Errorf("%s has not programmed %s", h.Name, joined)
	}
	if slices.ContainsFunc(peers.Peers, func(p api.AgentPeer) bool { return p.AgentID == left }) {
		return fmt.Errorf("%s still lists deleted %s", h.Name, left)
	}
	if !slices.ContainsFunc(peers.Tombstones, func(tb api.Tombstone) bool { return tb.AgentID == left }) {
		return fmt.Errorf("%s lacks the tombstone of %s", h.Name, left)
	}
	return nil
}
