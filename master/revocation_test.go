package master

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

// revokedRefusals sums carve_master_revoked_refusals_total{where} over the
// running masters.
func revokedRefusals(c *testCluster, where string) float64 {
	var sum float64
	for _, m := range c.running() {
		sum += revokedRefusalsOf(m, where)
	}
	return sum
}

// revokedRefusalsOf is m's carve_master_revoked_refusals_total{where}.
func revokedRefusalsOf(m *Master, where string) float64 {
	var mt dto.Metric
	_ = m.metrics.trust.revokedRefusals.WithLabelValues(where).Write(&mt)
	return mt.GetCounter().GetValue()
}

// TestRevokedAgentIsRefused: an operator revokes an agent's certificate
// through a follower; the revocation deletes the agent's record, and
// every master then refuses the certificate (401 naming it, counted), so
// the agent cannot register again, while another agent is unaffected.
// An agent may not revoke.
func TestRevokedAgentIsRefused(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.IssueAgent("a1", netip.MustParseAddr("198.18.6.1"))
	p.IssueAgent("a2", netip.MustParseAddr("198.18.6.2"))
	for i, id := range []string{"a1", "a2"} {
		if _, err := registerRetrying(ctx, c.clientAs(leader, id, pki.RoleAgent), api.RegisterRequest{AgentID: id, IP: fmt.Sprintf("198.18.6.%d", i+1)}); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	cert, err := pki.ReadCertificate(p.Files("a1", pki.RoleAgent).Cert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.clientAs(follower, "a2", pki.RoleAgent).Revoke(ctx, api.RevokeRequest{Serial: pki.Serial(cert)}); !api.IsCode(err, api.CodeForbidden) {
		t.Errorf("an agent revokes a certificate: %v, want 403", err)
	}
	ans, err := retrying(ctx, func() (*api.Revocations, error) {
		return c.client(follower).Revoke(ctx, api.RevokeRequest{Serial: pki.Serial(cert), Identity: "agent/a1", NotAfter: cert.NotAfter.Unix()})
	})
	if err != nil || len(ans.Revoked) != 1 || ans.Revoked[0].Serial != pki.Serial(cert) || strings.Join(ans.Deleted, ",") != "a1" {
		t.Fatalf("revoke a1's certificate: %+v %v", ans, err)
	}
	// A follower that has not applied the revocation yet still takes the
	// certificate and forwards the registration: the leader, which
	// committed the revocation, refuses it (before, it took the follower's
	// word, and the record came back; under load this test met the window).
	if code, answer := forwardedByLaggingFollower(ctx, t, c, p, leader, follower, "a1", cert); code != http.StatusUnauthorized || answer.Code != api.CodeRevoked || !strings.Contains(answer.Message, "is revoked") {
		t.Errorf("the leader answers a revoked agent's registration forwarded by %s: HTTP %d %+v, want 401 %s", c.ids[follower], code, answer, api.CodeRevoked)
	}
	for i := range 3 {
		testutil.Eventually(t, 0, "master "+c.ids[i]+" refuses the revoked certificate", func() error {
			_, err := c.clientAs(i, "a1", pki.RoleAgent).Register(ctx, api.RegisterRequest{AgentID: "a1", IP: "198.18.6.1"})
			if err == nil {
				// Taken: the revoked agent's record is back.
				return retry.Permanent(errors.New("the revoked certificate registered"))
			}
			if !api.IsCode(err, api.CodeRevoked) || !strings.Contains(err.Error(), "is revoked") {
				return err
			}
			return nil
		})
	}
	if _, err := c.client(leader).Agent(ctx, "a1"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("the revoked agent's record: %v, want not found", err)
	}
	if _, err := c.clientAs(leader, "a2", pki.RoleAgent).Agent(ctx, "a2"); err != nil {
		t.Errorf("another agent after the revocation: %v", err)
	}
	if got := revokedRefusals(c, revokedOnAPI); got < 3 {
		t.Errorf("carve_master_revoked_refusals_total{where=api} = %v, want at least 3", got)
	}
	if got := refusals(c, refusedRevoked); got < 3 {
		t.Errorf("carve_master_auth_refusals_total{reason=revoked} = %v, want at least 3", got)
	}
	list, err := c.client(leader).Revocations(ctx)
	if err != nil || len(list.Revoked) != 1 || list.Revoked[0].Identity != "agent/a1" {
		t.Errorf("GET /cluster/revocations: %+v %v", list, err)
	}
	st, err := c.client(leader).State(ctx, apiclient.StateOptions{})
	if err != nil || len(st.Revoked) != 1 {
		t.Errorf("the state's revoked list: %+v %v", st.Revoked, err)
	}
}

// forwardedByLaggingFollower sends the leader a registration of agent id
// (cert is its certificate) as a follower that has not applied the certificate's
// revocation forwards it (forwardHeaders: the follower still takes the
// certificate) under the follower's own master certificate, and returns the
// leader's answer.
func forwardedByLaggingFollower(ctx context.Context, t *testing.T, c *testCluster, p *testPKI, leader, follower int, id string, cert *x509.Certificate) (int, api.Error) {
	t.Helper()
	body, err := json.Marshal(api.RegisterRequest{AgentID: id, IP: "198.18.6.1", RequestID: api.NewRequestID()})
	if err != nil {
		t.Fatal(err)
	}
	in := httptest.NewRequest(http.MethodPost, "/overlay-master/agents", nil)
	in.Header.Set("Content-Type", "application/json")
	in.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	in = in.WithContext(context.WithValue(in.Context(), identityKey{}, pki.Identity{Role: pki.RoleAgent, Name: id}))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.urls()[leader]+"/overlay-master/agents", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = forwardHeaders(in, c.ids[follower])
	resp, err := p.httpClient(c.ids[follower], pki.RoleMaster).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer api.Error
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatalf("the leader's answer (HTTP %d): %v", resp.StatusCode, err)
	}
	return resp.StatusCode, answer
}

// TestRevokedMasterIsCutOffRaft: revoking a follower's master certificate
// closes the Raft connections the leader holds to it and its handshakes
// are refused from then on (counted): the other two masters keep
// committing, and the revoked one gets nothing new.
func TestRevokedMasterIsCutOffRaft(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	victim := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := c.client(leader)
	if _, err := registerRetrying(ctx, op, api.RegisterRequest{AgentID: "before", IP: "198.18.6.1"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "every master applies the first registration", func() error {
		for i, m := range c.masters {
			if _, ok := m.table.Agent("before"); !ok {
				return fmt.Errorf("%s lacks it", c.ids[i])
			}
		}
		return nil
	})
	cert, err := pki.ReadCertificate(p.Files(c.ids[victim], pki.RoleMaster).Cert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := retrying(ctx, func() (*api.Revocations, error) {
		return op.Revoke(ctx, api.RevokeRequest{Serial: pki.Serial(cert), Identity: "master/" + c.ids[victim]})
	}); err != nil {
		t.Fatal(err)
	}
	lead := c.masters[leader]
	raftRefusals := func() float64 { return revokedRefusalsOf(lead, revokedOnRaft) }
	testutil.Eventually(t, 0, "the leader cuts the revoked master off", testutil.True(func() bool { return raftRefusals() >= 1 }))
	if _, err := registerRetrying(ctx, op, api.RegisterRequest{AgentID: "after", IP: "198.18.6.2"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the two other masters apply the next registration", func() error {
		for i, m := range c.masters {
			if _, ok := m.table.Agent("after"); !ok && i != victim {
				return fmt.Errorf("%s lacks it", c.ids[i])
			}
		}
		return nil
	})
	floor := raftRefusals()
	testutil.Eventually(t, 0, "the leader keeps refusing the revoked master's handshakes", testutil.True(func() bool { return raftRefusals() > floor }))
	if _, ok := c.masters[victim].table.Agent("after"); ok {
		t.Errorf("the revoked master %s applied an entry committed after its revocation", c.ids[victim])
	}
}
