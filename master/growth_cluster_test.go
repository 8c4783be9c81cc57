package master

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

// retrying calls fn until it answers something other than a retryable
// error (a leader change in flight), as an agent would.
func retrying[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	backoff := retry.Backoff{First: 100 * time.Millisecond, Max: time.Second}
	for {
		v, err := fn()
		if err == nil || !api.IsRetryable(err) || ctx.Err() != nil {
			return v, err
		}
		if !retry.Sleep(ctx, backoff.Next()) {
			return v, err
		}
	}
}

// checkMasters waits until every running master's replicated state is the
// same (usage is the leader's alone) and checks the lease table invariants
// on each.
func (c *testCluster) checkMasters() {
	c.t.Helper()
	testutil.Eventually(c.t, 0, "the masters to converge", func() error {
		var first []byte
		for _, m := range c.running() {
			st := m.table.State()
			for i := range st.Agents {
				for j := range st.Agents[i].Overlays {
					for k := range st.Agents[i].Overlays[j].Blocks {
						st.Agents[i].Overlays[j].Blocks[k].Used, st.Agents[i].Overlays[j].Blocks[k].Free = nil, nil
					}
				}
			}
			data, _ := json.Marshal(st)
			if first != nil && !bytes.Equal(first, data) {
				return fmt.Errorf("%s differs", m.opts.ID)
			}
			first = data
		}
		return nil
	})
	for _, m := range c.running() {
		if err := m.table.CheckInvariants(); err != nil {
			c.t.Fatalf("%s: %v", m.opts.ID, err)
		}
	}
}

// TestClusterGrowthThroughLeaderKill grows, grants, returns, deletes and
// releases quarantine through a real 3-master cluster with TLS and signed
// records, killing the leader in the middle, and checks after every step
// that every master's table keeps the one-owner invariant and that the
// agents' certificates act only for themselves.
func TestClusterGrowthThroughLeaderKill(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	cfg := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/22", Prefix: 24}}})
	c := newTestClusterWith(t, 3, cfg, p)
	leader := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	agent := map[string]*apiclient.Client{}
	claim := map[string]ed25519.PrivateKey{}
	for i, id := range []string{"a1", "a2", "a3"} {
		p.IssueAgent(id, netip.MustParseAddr(fmt.Sprintf("198.18.4.%d", i+1)))
		agent[id] = c.clientAs(leader+i, id, pki.RoleAgent)
		var keys api.AgentKeys
		claim[id], keys = claimKey(t)
		if _, err := registerRetrying(ctx, agent[id], api.RegisterRequest{AgentID: id, IP: fmt.Sprintf("198.18.4.%d", i+1),
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}, Keys: keys}); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	c.checkMasters()
	pub := p.SigningKey.Public().(ed25519.PublicKey)
	clusterID := c.masters[leader].table.ClusterID()

	// a1 grows; the answer is signed over its blocks.
	info, err := retrying(ctx, func() (*api.AgentInfo, error) {
		return agent["a1"].Grow(ctx, "a1", api.GrowRequest{Overlay: "g", Bridge: api.BridgeMesos, Family: "4"})
	})
	if err != nil {
		t.Fatalf("grow: %v", err)
	}
	if err := api.VerifyRecord(pub, info, clusterID); err != nil {
		t.Errorf("grown record: %v", err)
	}
	if !slices.ContainsFunc(info.Overlay("g").Blocks, func(b api.Block) bool {
		return b.Prefix == "10.9.3.0/25" && b.Origin == api.BlockGrown
	}) {
		t.Errorf("a1's blocks after growing: %+v", info.Overlay("g").Blocks)
	}
	forged := *info
	forged.Overlays = slices.Clone(info.Overlays)
	forged.Overlays[0].Blocks = append(slices.Clone(info.Overlays[0].Blocks), api.Block{Bridge: api.BridgeMesos, Prefix: "10.9.2.0/25", Origin: api.BlockGranted, Donor: "a3", Version: info.Version})
	if err := api.VerifyRecord(pub, &forged, clusterID); !errors.Is(err, api.ErrBadSignature) {
		t.Errorf("a record with an added block verifies: %v", err)
	}
	c.checkMasters()

	// An agent acts only for itself.
	if _, err := agent["a2"].Grow(ctx, "a1", api.GrowRequest{Overlay: "g", Bridge: api.BridgeMesos, Family: "4"}); !api.IsCode(err, api.CodeForbidden) {
		t.Errorf("a2 grows for a1: %v", err)
	}
	if _, err := agent["a3"].ReportGrant(ctx, "a3", api.GrantReport{Overlay: "g", Prefix: "10.9.0.0/27", Donor: "a1", Recipient: "a2"}); !api.IsCode(err, api.CodeBadRequest) {
		t.Errorf("a3 reports a grant between a1 and a2: %v", err)
	}

	// a1 granted part of its lease to a2 through the ring; a2 reports it
	// with a1's signed word.
	info, err = retrying(ctx, func() (*api.AgentInfo, error) {
		return agent["a2"].ReportGrant(ctx, "a2", signedGrant(claim["a1"], api.GrantReport{Overlay: "g", Prefix: "10.9.0.64/26", Donor: "a1", Recipient: "a2"}, clusterID))
	})
	if err != nil || info.AgentID != "a2" {
		t.Fatalf("grant report: %v %+v", err, info)
	}
	c.checkMasters()
	// A grant of someone else's space is refused, naming both.
	_, err = agent["a2"].ReportGrant(ctx, "a2", signedGrant(claim["a1"], api.GrantReport{Overlay: "g", Prefix: "10.9.2.0/26", Donor: "a1", Recipient: "a2"}, clusterID))
	if !api.IsCode(err, api.CodeConflict) {
		t.Errorf("a grant of a3's space: %v", err)
	}

	// The leader dies; the rest goes through the new one.
	c.stop(leader)
	leader = c.waitLeader()
	if _, err := retrying(ctx, func() (*api.AgentInfo, error) {
		return agent["a2"].ReturnBlock(ctx, "a2", api.ReturnRequest{Overlay: "g", Prefix: "10.9.0.64/26"})
	}); err != nil {
		t.Fatalf("return: %v", err)
	}
	a1, err := c.client(leader).Agent(ctx, "a1")
	if err != nil || !slices.ContainsFunc(a1.Overlay("g").Blocks, func(b api.Block) bool { return b.Prefix == "10.9.0.0/25" }) {
		t.Errorf("the returned grant did not make a1's lease whole: %v %+v", err, a1)
	}
	c.checkMasters()
	// a1 grants again, is deleted before the grant is reported, and the
	// report arrives afterwards: a2 keeps the block, a new agent gets none
	// of a1's space while it is quarantined. The masters kept a1's claim
	// key with its quarantine: the report still needs a1's word. No
	// master waits to apply the deletion: the leader, which answered it,
	// decides (a follower forwards).
	if _, err := retrying(ctx, func() (*api.State, error) { return c.client(leader).DeleteAgents(ctx, []string{"a1"}) }); err != nil {
		t.Fatalf("delete a1: %v", err)
	}
	late := api.GrantReport{Overlay: "g", Prefix: "10.9.0.0/26", Donor: "a1", Recipient: "a2"}
	before := refusals(c, refusedGrantUnsigned)
	if _, err := agent["a2"].ReportGrant(ctx, "a2", late); !api.IsCode(err, api.CodeForbidden) {
		t.Fatalf("late grant report without the deleted donor's word: %v, want 403", err)
	}
	if got := refusals(c, refusedGrantUnsigned); got != before+1 {
		t.Errorf("refusals{reason=grant_unsigned} = %v, want %v", got, before+1)
	}
	if _, err := retrying(ctx, func() (*api.AgentInfo, error) {
		return agent["a2"].ReportGrant(ctx, "a2", signedGrant(claim["a1"], late, clusterID))
	}); err != nil {
		t.Fatalf("late grant report: %v", err)
	}
	// Outside a1's quarantine the grant is refused for good (409, which the
	// recipient drops), never 403 (which it would keep sending).
	if _, err := agent["a2"].ReportGrant(ctx, "a2", api.GrantReport{Overlay: "g", Prefix: "10.9.2.0/26", Donor: "a1", Recipient: "a2"}); !api.IsCode(err, api.CodeConflict) {
		t.Errorf("a late grant of space outside the deleted donor's quarantine: %v, want 409 conflict", err)
	}
	p.IssueAgent("a4", netip.MustParseAddr("198.18.4.4"))
	agent["a4"] = c.clientAs(leader, "a4", pki.RoleAgent)
	a4, err := registerRetrying(ctx, agent["a4"], api.RegisterRequest{AgentID: "a4", IP: "198.18.4.4"})
	if err != nil || a4.Overlay("g") != nil || !slices.ContainsFunc(a4.NotLeased, func(n api.NotLeased) bool { return n.Name == "g" }) {
		t.Errorf("a4 registered while a1's space is quarantined: %v %+v", err, a4)
	}
	c.checkMasters()

	// Complete usage reports from every live agent lift the quarantine;
	// a report naming a block the masters do not know acknowledges nothing.
	st, err := c.client(leader).State(ctx, apiclient.StateOptions{})
	if err != nil || len(st.Quarantine) == 0 {
		t.Fatalf("quarantine: %v %+v", err, st)
	}
	ans, err := retrying(ctx, func() (*api.UsageAnswer, error) {
		return agent["a3"].ReportUsage(ctx, "a3", api.UsageReport{StateIndex: st.Index,
			Overlays: []api.OverlayUsage{{Name: "g", Blocks: []api.BlockUsage{{Prefix: "10.9.2.0/25", Used: 3, Free: 124}, {Prefix: "10.9.1.0/28"}}}}})
	})
	if err != nil || ans.Acknowledged != 0 || !slices.Equal(ans.Unknown, []string{"g:10.9.1.0/28"}) {
		t.Errorf("a report with a block of a2's: %v %+v", err, ans)
	}
	for _, id := range []string{"a2", "a3", "a4"} {
		rec, err := c.client(leader).Agent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var bu []api.BlockUsage
		if ov := rec.Overlay("g"); ov != nil {
			for _, b := range ov.Blocks {
				bu = append(bu, api.BlockUsage{Prefix: b.Prefix, Used: 1, Free: 2})
			}
		}
		ans, err := retrying(ctx, func() (*api.UsageAnswer, error) {
			return agent[id].ReportUsage(ctx, id, api.UsageReport{StateIndex: st.Index, Overlays: []api.OverlayUsage{{Name: "g", Blocks: bu}}})
		})
		if err != nil || ans.Acknowledged != st.Index {
			t.Fatalf("usage of %s: %v %+v", id, err, ans)
		}
	}
	testutil.Eventually(t, 0, "the quarantine to be released", func() error {
		st, err := c.client(leader).State(ctx, apiclient.StateOptions{})
		if err != nil {
			return err
		}
		if len(st.Quarantine) > 0 {
			return fmt.Errorf("still quarantined: %+v", st.Quarantine)
		}
		return nil
	})
	// The usage shows in the leader's answers, unsigned.
	if rec, err := c.onlyClient(leader).Agent(ctx, "a3"); err != nil || rec.Overlay("g").Blocks[0].Used == nil {
		t.Errorf("a3's usage is not shown: %v %+v", err, rec)
	} else if err := api.VerifyRecord(pub, rec, clusterID); err != nil {
		t.Errorf("a record with usage: %v", err)
	}
	c.checkMasters()
	// a4 now gets what is left: not a whole /24 (a2's grant is inside), so
	// it grows into the pieces.
	if _, err = retrying(ctx, func() (*api.AgentInfo, error) {
		return agent["a4"].Grow(ctx, "a4", api.GrowRequest{Overlay: "g", Bridge: api.BridgeMesos, Family: "4"})
	}); err != nil {
		t.Fatalf("a4 grows: %v", err)
	}
	for {
		_, err := agent["a4"].Grow(ctx, "a4", api.GrowRequest{Overlay: "g", Bridge: api.BridgeDocker, Family: "4"})
		if api.IsCode(err, api.CodeExhausted) {
			break
		}
		if err != nil {
			t.Fatalf("grow until exhausted: %v", err)
		}
	}
	c.checkMasters()
	// The killed master comes back and agrees.
	for i := range c.masters {
		if c.masters[i] == nil {
			c.start(i)
		}
	}
	c.waitLeader()
	c.checkMasters()
}
