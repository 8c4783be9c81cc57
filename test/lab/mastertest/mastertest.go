// Package mastertest starts a one-voter master on loopback for tests of the
// parts that talk to masters (agents, the Docker plugin, the operator
// commands, with their flags and registered agents); the masters'
// own cluster behaviour is tested with three nodes in package master.
package mastertest

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
	"github.com/carve-net/carve/test/lab/pkitest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// Start runs a master with cfg in dir, without TLS (--insecure), waits
// until it leads with the cluster id and the configuration committed (it
// serves the state then), and stops it when the test ends.
// tune, when given, adjusts the options (tombstone compaction, say).
func Start(t testing.TB, dir string, cfg api.NetworkConfig, log *slog.Logger, tune ...func(*master.Options)) *master.Master {
	t.Helper()
	return start(t, dir, cfg, log, func(o *master.Options) { o.Insecure = true }, tune...)
}

// Secure is a master that serves TLS and signs records, and the cluster CA
// that secures it.
type Secure struct {
	*master.Master
	// CA issues the certificates of clients (an agent's name is its agent
	// id) and holds the signing key pair (pki.SignPub in CA.Dir).
	CA *pkitest.CA
}

// StartSecure runs a master like Start with a new cluster CA: TLS on its
// API and Raft, client certificates authorized by role, records signed.
// Its URL is https://.
func StartSecure(t testing.TB, dir string, cfg api.NetworkConfig, log *slog.Logger, tune ...func(*master.Options)) *Secure {
	t.Helper()
	ca := pkitest.New(t)
	m := start(t, dir, cfg, log, func(o *master.Options) { o.TLS, o.SigningKey = ca.Files("m1", pki.RoleMaster), ca.SigningKey }, tune...)
	return &Secure{Master: m, CA: ca}
}

// StartSigning runs a master like Start (plain http, no authentication)
// that signs every record and tombstone with key, for tests that put their
// own proxy between agents and masters.
func StartSigning(t testing.TB, dir string, cfg api.NetworkConfig, log *slog.Logger, key ed25519.PrivateKey, tune ...func(*master.Options)) *master.Master {
	t.Helper()
	return start(t, dir, cfg, log, func(o *master.Options) { o.Insecure, o.SigningKey = true, key }, tune...)
}

func start(t testing.TB, dir string, cfg api.NetworkConfig, log *slog.Logger, secure func(*master.Options), tune ...func(*master.Options)) *master.Master {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := master.Options{
		ID: "m1", DataDir: dir, HTTPAddr: "127.0.0.1:0", RaftAddr: ln.Addr().String(),
		Peers:   []raftlog.Server{{ID: "m1", Address: ln.Addr().String(), Voter: true}},
		Network: cfg, Logger: log,
		TuneRaft: func(c *raftlog.Config) {
			c.Listener = ln
			c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
		},
	}
	secure(&opts)
	for _, f := range tune {
		f(&opts)
	}
	m, err := master.Start(context.Background(), opts)
	if err != nil {
		ln.Close()
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

// ClientFlags are the command-line flags of a carve operator command
// against this master: --masters and the TLS flags of a certificate of
// role for name (issued when missing).
func (s *Secure) ClientFlags(name string, role pki.Role) []string {
	f := s.CA.Files(name, role)
	return []string{"--masters", "https://" + s.HTTPAddr(), "--ca-file", f.CA, "--cert-file", f.Cert, "--key-file", f.Key}
}

// RegisterAgents registers agents (id: underlay IP), each with its own
// certificate, both bridges enabled.
func (s *Secure) RegisterAgents(t testing.TB, agents map[string]string) {
	t.Helper()
	for id, ip := range agents {
		s.CA.IssueAgent(id, netip.MustParseAddr(ip))
		c, err := apiclient.NewClientWith([]string{"https://" + s.HTTPAddr()}, apiclient.ClientOptions{TLS: s.CA.ClientTLS(id, pki.RoleAgent)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = c.Register(ctx, api.RegisterRequest{AgentID: id, IP: ip, NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}})
		cancel()
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
}
