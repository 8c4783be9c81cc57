package raftlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/carve-net/carve/test/lab/testutil"
)

// fullDiskCycles is how many times TestFollowerCatchesUpOnceItsDiskIsFreed
// fills and frees a follower's disk: each first refused append was one
// more chance for the pipelined replication to deadlock (see there).
const fullDiskCycles = 20

// TestFollowerCatchesUpOnceItsDiskIsFreed: every node's data dir is a small
// tmpfs of its own; while the leader takes a steady flood of writes, a
// follower's disk is filled (its appends fail with no space left on
// device), then freed, again and again. Each time it must catch up with
// the leader without a restart. With raft's pipelined replication it did
// not, now and then: the follower's first refused append ended the
// pipeline's decoder while the sender, woken by the next write before it
// saw that, handed over one more request, and both parked for good; the
// leader never sent the follower another entry while its heartbeats went
// on (a master stayed at its last index after its disk was freed: the
// troubleshooting guide's "a master behind"), and the leader's Close hung.
func TestFollowerCatchesUpOnceItsDiskIsFreed(t *testing.T) {
	testutil.Require(t, os.Geteuid() == 0, "raftlog: mounting a tmpfs for a full disk needs root (CAP_SYS_ADMIN); run the tests as root")
	refused := map[string]*refusedAppends{}
	c := &cluster{t: t, tune: func(cfg *Config) {
		// The masters' commit timeout (master.Start): a follower is sent
		// an entry-less request every 10-20 ms besides those of the writes.
		cfg.CommitTimeout = 10 * time.Millisecond
		cfg.Logger = slog.New(refused[cfg.ID])
	}}
	for i := range 3 {
		refused[fmt.Sprintf("n%d", i+1)] = &refusedAppends{}
		tn := c.newTestNode()
		c.peers = append(c.peers, Server{ID: tn.id, Address: tn.addr, Voter: true})
		testutil.SmallDisk(t, tn.dir, "64m")
	}
	var nodes []*Node
	for _, tn := range c.nodes {
		c.start(tn, c.peers)
		nodes = append(nodes, tn.node)
	}
	closeBounded(t, c)
	c.waitLeader()
	flood(t, nodes, 8)

	for cycle := range fullDiskCycles {
		c.waitLeader()
		follower := c.followers()[0]
		before := refused[follower.id].count.Load()
		filler := (&testutil.Disk{Dir: follower.dir}).Fill(t)
		testutil.Eventually(t, time.Minute, fmt.Sprintf("cycle %d: %s refusing an append with its disk full", cycle, follower.id), func() error {
			if refused[follower.id].count.Load() == before {
				return fmt.Errorf("%s has refused no append yet (last index %d)", follower.id, follower.node.Status().LastIndex)
			}
			return nil
		})
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		target := committedIndex(nodes)
		// raft backs off from a failing follower for at most ~10 s.
		testutil.Eventually(t, 45*time.Second, fmt.Sprintf("cycle %d: %s caught up to %d with its disk freed", cycle, follower.id, target), func() error {
			if st := follower.node.Status(); st.AppliedIndex < target {
				return fmt.Errorf("%s applied %d, last index %d, commit index %d", follower.id, st.AppliedIndex, st.LastIndex, st.CommitIndex)
			}
			return nil
		})
	}
	t.Logf("%d cycles of a full disk; the cluster committed %d entries", fullDiskCycles, committedIndex(nodes))
}

// refusedAppends is a slog.Handler that counts raft's "failed to append
// to logs" (a follower refusing the leader's entries) and drops the rest.
type refusedAppends struct{ count atomic.Int64 }

func (h *refusedAppends) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }

func (h *refusedAppends) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "failed to append to logs" {
		h.count.Add(1)
	}
	return nil
}

func (h *refusedAppends) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *refusedAppends) WithGroup(string) slog.Handler      { return h }

// committedIndex is the highest commit index of nodes.
func committedIndex(nodes []*Node) uint64 {
	var index uint64
	for _, n := range nodes {
		index = max(index, n.Status().CommitIndex)
	}
	return index
}

// closeBounded closes the nodes of a failed test, each within 30 s, before
// the cluster's own clean-up would wait for them without a bound: a node
// whose replication is stuck never finishes closing.
func closeBounded(t *testing.T, c *cluster) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, tn := range c.nodes {
			n := tn.node
			if n == nil {
				continue
			}
			tn.node = nil
			done := make(chan error, 1)
			go func() { done <- n.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("close %s: %v", tn.id, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s: Close did not return within 30 s: a raft goroutine is stuck", tn.id)
			}
		}
	})
}

// TestTransportDoesNotPipeline: raft replicates through our transport one
// request at a time (see newTransport).
func TestTransportDoesNotPipeline(t *testing.T) {
	c := newCluster(t, 1, nil)
	tn := c.nodes[0]
	c.waitLeader()
	p, err := tn.node.trans.AppendEntriesPipeline(raft.ServerID(tn.id), raft.ServerAddress(tn.addr))
	if p != nil {
		_ = p.Close()
	}
	if !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("AppendEntriesPipeline: err = %v, want raft.ErrPipelineReplicationNotSupported", err)
	}
}

// flood applies commands on whichever of nodes leads from writers
// goroutines until the test ends, so that the leader always has new
// entries to send.
func flood(t *testing.T, nodes []*Node, writers int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	payload := make([]byte, 16)
	for w := range writers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				var leader *Node
				for _, n := range nodes {
					if n.IsLeader() {
						leader = n
					}
				}
				if leader == nil {
					// No leader now: try again shortly.
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				actx, acancel := context.WithTimeout(ctx, 5*time.Second)
				// Errors (a leadership change) do not matter: the test
				// checks the follower against what the leader committed.
				_, _, _ = leader.Apply(actx, append([]byte(fmt.Sprintf("w%d-%d-", w, i)), payload...))
				acancel()
			}
		})
	}
}
