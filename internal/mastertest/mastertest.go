// Package mastertest starts a one-voter master on loopback for tests of the
// parts that talk to masters (agents, the Docker plugin); the masters'
// own cluster behaviour is tested with three nodes in package master.
package mastertest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/testutil"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/raftlog"
)

// Start runs a master with cfg in dir, waits until it leads with the
// cluster id and the configuration committed (it serves the state then), and
// stops it when the test ends.
func Start(t testing.TB, dir string, cfg api.NetworkConfig, log *slog.Logger) *master.Master {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := master.Start(context.Background(), master.Options{
		ID: "m1", DataDir: dir, HTTPAddr: "127.0.0.1:0", RaftAddr: ln.Addr().String(),
		Peers:   []raftlog.Server{{ID: "m1", Address: ln.Addr().String(), Voter: true}},
		Network: cfg, Logger: log,
		TuneRaft: func(c *raftlog.Config) {
			c.Listener = ln
			c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	testutil.Eventually(t, 0, "the master to lead with its cluster id and configuration committed", func() error {
		if !m.Node().IsLeader() || !m.Node().IsCaughtUp() {
			return errors.New("not the leader yet")
		}
		if _, ok := m.Table().Network(); !ok || m.Table().ClusterID() == "" {
			return errors.New("cluster id and configuration not committed yet")
		}
		return nil
	})
	return m
}
