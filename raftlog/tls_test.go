package raftlog

import (
	"crypto/tls"
	"errors"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// transportTLS is the mutual transport configuration a master would use,
// with a certificate of the role from ca: both sides verified against the
// CA, and the peer must carry the master role.
func transportTLS(ca *pkitest.CA, id string, role pki.Role) *TransportTLS {
	name := fmt.Sprintf("%s-%s", id, role)
	server, client := ca.ServerTLS(name, role, true), ca.ClientTLS(name, role)
	server.VerifyConnection = pki.RequireRole(pki.RoleMaster)
	client.VerifyConnection = pki.RequireRole(pki.RoleMaster)
	return &TransportTLS{Server: server, Client: client}
}

func tlsFailures(n *Node, direction string) float64 {
	var m dto.Metric
	if err := n.metrics.tlsFailures.WithLabelValues(direction).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// A cluster replicates over mutual TLS, and a node that is not a master of
// the cluster's CA (another CA, an agent's certificate, or plain TCP)
// neither disturbs it by campaigning nor receives its log once added.
func TestTLSTransportRefusesStrangers(t *testing.T) {
	t.Parallel() // its own nodes: loopback listeners, data dirs; it mostly waits on elections
	tests := []struct {
		name string
		tls  func(ca, foreign *pkitest.CA, id string) *TransportTLS
	}{
		{"certificate of another CA", func(_, foreign *pkitest.CA, id string) *TransportTLS {
			return transportTLS(foreign, id, pki.RoleMaster)
		}},
		{"agent certificate of the cluster CA", func(ca, _ *pkitest.CA, id string) *TransportTLS { return transportTLS(ca, id, pki.RoleAgent) }},
		{"plain TCP", func(_, _ *pkitest.CA, _ string) *TransportTLS { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca, foreign := pkitest.New(t), pkitest.New(t)
			c := newCluster(t, 3, func(cfg *Config) {
				// With the rogue a voter, a quorum needs every real node:
				// the test's quick timeouts would let one follower starved
				// of CPU for 200 ms depose the leader, which is not the
				// rogue's doing (seen under -race beside other packages).
				cfg.HeartbeatTimeout, cfg.ElectionTimeout = DefaultHeartbeatTimeout, DefaultElectionTimeout
				cfg.LeaderLeaseTimeout = DefaultLeaderLeaseTimeout
				if cfg.TLS == nil {
					cfg.TLS = transportTLS(ca, cfg.ID, pki.RoleMaster)
				}
			})
			real := c.nodes
			leader := c.waitLeader()
			last := c.applyN("before", 20)
			c.waitConverged(last)
			term := leader.node.Status().Term

			rogue := c.newTestNode()
			// The rogue believes it belongs to the cluster: it campaigns,
			// dialing every real node.
			peers := append(append([]Server{}, c.peers...), Server{ID: rogue.id, Address: rogue.addr, Voter: true})
			cfg := c.config(rogue, peers)
			cfg.TLS = tt.tls(ca, foreign, rogue.id)
			if cfg.TLS != nil {
				// The rogue's own checks do not matter: it trusts everyone.
				cfg.TLS.Server.VerifyConnection, cfg.TLS.Client.VerifyConnection = nil, nil
				cfg.TLS.Client.InsecureSkipVerify = true
				cfg.TLS.Server.ClientAuth = tls.RequestClientCert
			}
			rogue.sm = newTestSM()
			n, err := Open(ctxTimeout(t, 5*time.Second), cfg, rogue.sm)
			if err != nil {
				t.Fatal(err)
			}
			rogue.node = n

			incoming := func() (sum float64) {
				for _, tn := range real {
					sum += tlsFailures(tn.node, directionIncoming)
				}
				return sum
			}
			testutil.Eventually(t, 0, "the real nodes to refuse the rogue's connections", testutil.True(func() bool { return incoming() >= 3 }))

			// Added as a voter, it still gets nothing: the leader cannot
			// complete a handshake with it. On a loaded machine the real
			// nodes may have elected again since (the rogue campaigns):
			// added through whichever leads now, and every real node's
			// handshakes count (a later leader dials the rogue too).
			outgoing := func() (sum float64) {
				for _, tn := range real {
					sum += tlsFailures(tn.node, directionOutgoing)
				}
				return sum
			}
			out := outgoing()
			err = retry.Until(ctxTimeout(t, 30*time.Second), 20*time.Millisecond, func() error {
				err := c.waitLeader(real...).node.AddVoter(ctxTimeout(t, 10*time.Second), rogue.id, rogue.addr)
				if err != nil && !errors.Is(err, ErrNotLeader) {
					return retry.Permanent(err)
				}
				return err
			})
			if err != nil {
				t.Fatalf("AddVoter: %v", err)
			}
			testutil.Eventually(t, 0, "the leader to fail its handshakes with the rogue", testutil.True(func() bool {
				return outgoing() >= out+2
			}))
			for i := range 5 {
				// On a loaded machine the real nodes may elect again (the
				// rogue, a voter now, never answers): applied on whichever
				// of them leads, as c.apply does.
				err := retry.Until(ctxTimeout(t, 30*time.Second), 20*time.Millisecond, func() error {
					_, _, err := c.waitLeader(real...).node.Apply(ctxTimeout(t, 10*time.Second), []byte(fmt.Sprintf("after-%d", i)))
					if err != nil && !errors.Is(err, ErrNotLeader) {
						return retry.Permanent(err)
					}
					return err
				})
				if err != nil {
					t.Fatalf("apply with the rogue in the configuration: %v", err)
				}
			}
			c.waitConverged(last+5, real...)
			if got := rogue.sm.fingerprint(); got.Count != 0 {
				t.Errorf("the rogue applied %d commands of the cluster", got.Count)
			}
			// A real node leads, in a term below the rogue's: had any of
			// its campaigns reached a real node, that node would have
			// taken its term (a term, not an election's timing: the real
			// nodes may elect again on a loaded machine).
			lead := c.waitLeader(real...)
			if rogue.node.IsLeader() {
				t.Errorf("the rogue leads")
			}
			if rt, st := rogue.node.Status().Term, lead.node.Status().Term; rt > term && st >= rt {
				t.Errorf("the rogue disturbed the cluster: its leader's term %d reached the rogue's %d (was %d)", st, rt, term)
			}
		})
	}
}
