// Package mastertest starts a one-voter master on loopback for tests of the
// parts that talk to masters (agents, the Docker plugin); the masters'
// own cluster behaviour is tested with three nodes in package master.
package mastertest

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/raftlog"
)

// Start runs a master with cfg in dir, waits until it leads with the
// configuration committed, and stops it when the test ends.
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := m.Table().Network(); ok && m.Node().IsLeader() {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatal("mastertest: the master did not lead with its config committed within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
