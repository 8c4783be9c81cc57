package master

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/membershiptest"
)

// claimKey makes an agent's claim key and the keys it registers.
func claimKey(t testing.TB) (ed25519.PrivateKey, api.AgentKeys) {
	t.Helper()
	pub, priv := membershiptest.Key(t)
	return priv, api.AgentKeys{Claim: base64.StdEncoding.EncodeToString(pub)}
}

// signedGrant is g with its donor's signature by key, valid for a day
// (the request id is signed: one is set here, as the client would).
func signedGrant(key ed25519.PrivateKey, g api.GrantReport, clusterID string) api.GrantReport {
	if g.RequestID == "" {
		g.RequestID = api.NewRequestID()
	}
	if g.Expires == 0 {
		g.Expires = time.Now().Add(24 * time.Hour).Unix()
	}
	api.SignGrant(key, &g, clusterID)
	return g
}

// TestGrantNeedsTheDonorsWord replays attack 2 of issue 19: h1's agent
// certificate reports a grant of h2's first lease to itself. Without h2's
// signed word (none, h1's own, an expired one, one of another cluster) it
// is refused with 403 naming what is missing, counted by reason, and no
// record changes; with it, or from the donor itself, it is recorded.
func TestGrantNeedsTheDonorsWord(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	cfg := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{{Name: "g", Subnet: "10.9.0.0/22", Prefix: 24}}})
	c := newTestClusterWith(t, 1, cfg, p)
	leader := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent := map[string]*apiclient.Client{}
	claim := map[string]ed25519.PrivateKey{}
	lease := map[string]string{}
	for i, id := range []string{"h1", "h2"} {
		ip := fmt.Sprintf("198.18.5.%d", i+1)
		p.IssueAgent(id, netip.MustParseAddr(ip)) // the IP it may register
		agent[id] = c.clientAs(leader, id, pki.RoleAgent)
		var keys api.AgentKeys
		claim[id], keys = claimKey(t)
		info, err := registerRetrying(ctx, agent[id], api.RegisterRequest{AgentID: id, IP: ip,
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}, Keys: keys})
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
		lease[id] = info.Overlay("g").Subnet
	}
	clusterID := c.masters[leader].table.ClusterID()
	sub := netip.MustParsePrefix(lease["h2"])
	prefix := netip.PrefixFrom(sub.Addr(), sub.Bits()+1).String() // h2's first lease's first half
	forged := api.GrantReport{Overlay: "g", Prefix: prefix, Donor: "h2", Recipient: "h1"}
	expired := forged
	expired.Expires = time.Now().Add(-time.Minute).Unix()
	tests := []struct {
		name    string
		report  api.GrantReport
		reason  string
		mention string
	}{
		{"unsigned (the attack as found)", forged, refusedGrantUnsigned, "donor_signature"},
		{"signed by the recipient", signedGrant(claim["h1"], forged, clusterID), refusedGrantBadSignature, "claim key"},
		{"signed for another cluster", signedGrant(claim["h2"], forged, "other"), refusedGrantBadSignature, "claim key"},
		{"expired", signedGrant(claim["h2"], expired, clusterID), refusedGrantExpired, "expired"},
		{"another prefix than signed", func() api.GrantReport {
			g := signedGrant(claim["h2"], forged, clusterID)
			g.Prefix = lease["h2"]
			return g
		}(), refusedGrantBadSignature, "claim key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := refusals(c, tt.reason)
			_, err := agent["h1"].ReportGrant(ctx, "h1", tt.report)
			var e *api.Error
			if !api.IsCode(err, api.CodeForbidden) || !errors.As(err, &e) || !strings.Contains(e.Message, tt.mention) {
				t.Fatalf("report = %v; want 403 mentioning %q", err, tt.mention)
			}
			if got := refusals(c, tt.reason); got != before+1 {
				t.Errorf("refusals{reason=%q} = %v, want %v", tt.reason, got, before+1)
			}
		})
	}
	// Nothing moved: h2 still holds its lease, h1 none of it.
	op := c.client(leader)
	for id, want := range map[string]bool{"h1": false, "h2": true} {
		info, err := op.Agent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		holds := slices.ContainsFunc(info.Overlay("g").Blocks, func(b api.Block) bool {
			return netip.MustParsePrefix(b.Prefix).Contains(sub.Addr())
		})
		if holds != want {
			t.Errorf("%s holds h2's lease: %v, want %v (%+v)", id, holds, want, info.Overlay("g").Blocks)
		}
	}
	// With h2's word it is recorded; so is one h2 reports itself.
	if _, err := agent["h1"].ReportGrant(ctx, "h1", signedGrant(claim["h2"], forged, clusterID)); err != nil {
		t.Fatalf("a grant with its donor's word: %v", err)
	}
	second := sub.Addr().Next()
	for range (1 << (32 - sub.Bits() - 1)) - 1 {
		second = second.Next()
	}
	own := api.GrantReport{Overlay: "g", Prefix: netip.PrefixFrom(second, sub.Bits()+2).String(), Donor: "h2", Recipient: "h1"}
	if _, err := agent["h2"].ReportGrant(ctx, "h2", own); err != nil {
		t.Fatalf("a grant its donor reports: %v", err)
	}
}

// TestGrantReportsAreJudgedByTheLeader: a follower's table may lag behind
// the donor's registration or a new claim key, so a recipient's grant
// report is judged by the leader's table, however it arrives: a report
// through a follower is refused (and counted) by the leader, and one
// signed with the donor's claim key of a moment ago is recorded, never
// refused by a follower that has not applied the key yet.
func TestGrantReportsAreJudgedByTheLeader(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	cfg := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{{Name: "g", Subnet: "10.9.0.0/22", Prefix: 24}}})
	c := newTestClusterWith(t, 3, cfg, p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ips := map[string]string{"h1": "198.18.6.1", "h2": "198.18.6.2"}
	lease := map[string]string{}
	for id, ip := range ips {
		p.IssueAgent(id, netip.MustParseAddr(ip))
		_, keys := claimKey(t)
		info, err := registerRetrying(ctx, c.clientAs(leader, id, pki.RoleAgent), api.RegisterRequest{AgentID: id, IP: ip,
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}, Keys: keys})
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
		lease[id] = info.Overlay("g").Subnet
	}
	c.waitConverged()
	onLeader := c.clientAs(leader, "h2", pki.RoleAgent)
	viaFollower := c.clientAs(follower, "h1", pki.RoleAgent)
	clusterID := c.masters[leader].table.ClusterID()
	sub := netip.MustParsePrefix(lease["h2"])
	grant := api.GrantReport{Overlay: "g", Prefix: netip.PrefixFrom(sub.Addr(), sub.Bits()+1).String(), Donor: "h2", Recipient: "h1"}
	countedOn := func(i int) float64 {
		var mt dto.Metric
		_ = c.masters[i].metrics.authRefusals.WithLabelValues(refusedGrantUnsigned).Write(&mt)
		return mt.GetCounter().GetValue()
	}
	leaderBefore, followerBefore := countedOn(leader), countedOn(follower)
	if _, err := viaFollower.ReportGrant(ctx, "h1", grant); !api.IsCode(err, api.CodeForbidden) {
		t.Fatalf("an unsigned report through a follower: %v, want 403", err)
	}
	if got := countedOn(leader); got != leaderBefore+1 {
		t.Errorf("the leader counted %v unsigned reports, want %v", got, leaderBefore+1)
	}
	if got := countedOn(follower); got != followerBefore {
		t.Errorf("the follower counted %v unsigned reports, want %v (the leader judges)", got, followerBefore)
	}
	// h2's claim key is replaced (its agent lost claim.key and made a new
	// one); at once, h1 reports h2's grant signed with the new key.
	newKey, keys := claimKey(t)
	if _, err := registerRetrying(ctx, onLeader, api.RegisterRequest{AgentID: "h2", IP: ips["h2"],
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}, Keys: keys}); err != nil {
		t.Fatalf("h2 registers its new claim key: %v", err)
	}
	info, err := viaFollower.ReportGrant(ctx, "h1", signedGrant(newKey, grant, clusterID))
	if err != nil {
		t.Fatalf("a report signed with the donor's new key, through a follower: %v", err)
	}
	if !slices.ContainsFunc(info.Overlay("g").Blocks, func(b api.Block) bool { return b.Prefix == grant.Prefix && b.Donor == "h2" }) {
		t.Errorf("h1's blocks after the grant: %+v", info.Overlay("g").Blocks)
	}
}
