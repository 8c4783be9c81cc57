package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// trustView is what an attack must not change: every agent's kernel
// entries as the masters' records ask for them (IP, VTEP, subnets), with
// the record's version, and every host's kernel.
type trustView struct {
	records map[string]string
	kernels map[string]*labcluster.KernelState
}

func viewCluster(ctx context.Context, t *testing.T, c *labcluster.Cluster) trustView {
	t.Helper()
	st, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := trustView{records: map[string]string{}, kernels: map[string]*labcluster.KernelState{}}
	for _, a := range st.Agents {
		pe, err := labcluster.EntriesOf(a)
		if err != nil {
			t.Fatal(err)
		}
		v.records[a.AgentID] = fmt.Sprintf("v%d ip %s %+v", a.Version, a.IP, pe)
	}
	for _, h := range c.Hosts() {
		if v.kernels[h.Name], err = c.Kernel(h); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// unchanged fails the test when the cluster's records (but those of the
// agents in except) or any host's kernel differ from before.
func (before trustView) unchanged(ctx context.Context, t *testing.T, c *labcluster.Cluster, except ...string) {
	t.Helper()
	after := viewCluster(ctx, t, c)
	for id, rec := range before.records {
		if strings.Contains(strings.Join(except, ","), id) {
			continue
		}
		if after.records[id] != rec {
			t.Errorf("agent %s's record changed:\n got %s\nwant %s", id, after.records[id], rec)
		}
	}
	if len(except) > 0 {
		return // the excepted agent's own entries moved in every kernel
	}
	for name, ks := range before.kernels {
		if !reflect.DeepEqual(after.kernels[name], ks) {
			t.Errorf("%s's kernel changed:\n got %s\nwant %s", name, after.kernels[name], ks)
		}
	}
}

// mastersMetric sums one sample of every running master's /metrics.
func mastersMetric(ctx context.Context, c *labcluster.Cluster, sample string) (float64, error) {
	var sum float64
	for _, m := range c.Masters() {
		if !m.Running() {
			continue
		}
		v, err := metricSample(ctx, c.HTTPClient(), m.URL(), sample)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// waitMetricAbove waits until read gives more than floor (by at least
// min) and returns the last value.
func waitMetricAbove(ctx context.Context, t *testing.T, what string, floor, min float64, read func() (float64, error)) float64 {
	t.Helper()
	var v float64
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		var err error
		if v, err = read(); err == nil && v < floor+min {
			err = fmt.Errorf("%s is %v, want at least %v", what, v, floor+min)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCompromisedAgentCertificate replays attacks 3 to 6 of issue 19 with a
// real cluster in network namespaces: a compromised host holds h1's agent
// certificate (and, for attack 5, anyone reaches the masters' port). Every
// master and agent first shows carve_cert_expiry_seconds.
//
//  3. h1's certificate registers h1 with h2's underlay IP: 403 naming both
//     IPs, nothing changes, counted (wrong_ip). A record that did lose its
//     IP (to an operator's registration) is registered again by its agent.
//  5. 1,000 idle connections without a certificate against the leader
//     (--max-connections 1000): /healthz (without a certificate) and a
//     write forwarded by a follower still succeed; evictions are counted.
//  6. h3's certificate is revoked with carve certs revoke: its record is
//     deleted, the masters refuse it (401 revoked, counted), its agent
//     logs why and the fix, and the kernels follow the masters. Given a
//     new certificate and reloaded (no restart), h3 registers again; the
//     records it held before the revocation stay refused in gossip.
//  4. (last: the space it grows stays) h1's certificate grows h1 until its
//     quota (quota_prefix /23: four grown /25s): 409 quota naming the cap,
//     counted; the other records stay as they were, what h1 grew is routed
//     to h1, no address is held twice, and an agent registered next still
//     gets a subnet.
func TestCompromisedAgentCertificate(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	cfg := netconfig.Default()
	cfg.Overlays[0].QuotaPrefix = 23
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix, Network: &cfg,
		MasterArgs: []string{"--max-connections", "1000"}})
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	h1, h2, h3 := c.Host(1), c.Host(2), c.Host(3)
	var evil *apiclient.Client
	step("converge", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitKernelMatchesMasters(ctx, t, c)
		var err error
		if evil, err = c.ClientAs(c.AgentFiles(h1)); err != nil {
			t.Fatal(err)
		}
		// Every component shows how long its certificate and the CA last.
		for _, m := range c.Masters() {
			for _, sample := range []string{`carve_cert_expiry_seconds{cert="ca"}`, `carve_cert_expiry_seconds{cert="master/` + m.ID + `"}`} {
				if v, err := metricSample(ctx, c.HTTPClient(), m.URL(), sample); err != nil || v <= 0 {
					t.Errorf("%s: %s = %v (%v), want the seconds left", m.ID, sample, v, err)
				}
			}
		}
		if v, err := agentMetric(ctx, c, h1, `carve_cert_expiry_seconds{cert="agent/`+h1.CertName()+`"}`); err != nil || v <= 0 {
			t.Errorf("h1: carve_cert_expiry_seconds = %v (%v), want the seconds left", v, err)
		}
	})

	step("attack 3: h1 registers h2's IP", func(t *testing.T) {
		ctx := within(t, converge)
		before := viewCluster(ctx, t, c)
		refused, err := mastersMetric(ctx, c, `carve_master_auth_refusals_total{reason="wrong_ip"}`)
		if err != nil {
			t.Fatal(err)
		}
		h2IP := h2.IP().Addr().String()
		_, err = evil.Register(ctx, api.RegisterRequest{AgentID: h1.AgentID(), IP: h2IP, MeshAddr: net.JoinHostPort(h2IP, "6783")})
		if !api.IsCode(err, api.CodeForbidden) || !strings.Contains(err.Error(), "may not register ip "+h2IP) || !strings.Contains(err.Error(), h1.IP().Addr().String()) {
			t.Fatalf("h1's certificate registers h2's IP: %v, want 403 naming both IPs", err)
		}
		waitMetricAbove(ctx, t, "wrong_ip refusals", refused, 1, func() (float64, error) {
			return mastersMetric(ctx, c, `carve_master_auth_refusals_total{reason="wrong_ip"}`)
		})
		before.unchanged(ctx, t, c)
	})

	step("a record that lost its IP registers again", func(t *testing.T) {
		ctx := within(t, converge)
		h2IP := h2.IP().Addr().String()
		if _, err := c.Client().Register(ctx, api.RegisterRequest{AgentID: "intruder", IP: h2IP}); err != nil {
			t.Fatal(err)
		}
		err := retry.Until(ctx, 200*time.Millisecond, func() error {
			for id, want := range map[string]string{h2.AgentID(): h2IP, "intruder": api.NoIP} {
				a, err := c.Client().Agent(ctx, id)
				if err != nil {
					return err
				}
				if a.IP != want {
					return fmt.Errorf("%s's record has ip %s, want %s", id, a.IP, want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("h2's agent did not take its IP back: %v", err)
		}
		if n, err := agentMetric(ctx, c, h2, "carve_agent_lost_ip_registrations_total"); err != nil || n < 1 {
			t.Errorf("h2's carve_agent_lost_ip_registrations_total = %v (%v), want at least 1", n, err)
		}
		if err := c.Client().DeleteAgent(ctx, "intruder"); err != nil {
			t.Fatal(err)
		}
		waitKernelMatchesMasters(ctx, t, c)
	})

	step("attack 5: idle connections without a certificate", func(t *testing.T) {
		ctx := within(t, converge)
		leader, err := c.WaitLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// An idle connection without a certificate is closed either to
		// make room (evicted) or at its handshake deadline (a failed
		// handshake): which one depends on how fast the leader accepts.
		closedByServer := func() (float64, error) {
			evicted, err := metricSample(ctx, c.HTTPClient(), leader.URL(), "carve_master_unauthenticated_conns_evicted_total")
			if err != nil {
				return 0, err
			}
			timedOut, err := metricSample(ctx, c.HTTPClient(), leader.URL(), "carve_master_tls_handshake_failures_total")
			return evicted + timedOut, err
		}
		closed, err := closedByServer()
		if err != nil {
			t.Fatal(err)
		}
		dial := c.HTTPClient().Transport.(*http.Transport).DialContext // from the underlay
		for i := range 1000 {
			conn, err := dial(ctx, "tcp", leader.HTTPAddr)
			if err != nil {
				t.Fatalf("idle connection %d: %v", i, err)
			}
			t.Cleanup(func() { conn.Close() })
		}
		anon, err := c.HTTPClientAs(pki.Files{CA: c.OperatorFiles().CA})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, err := anon.Get(leader.URL() + "/healthz")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz without a certificate behind 1,000 idle connections: %v %v", resp, err)
		}
		resp.Body.Close()
		t.Logf("/healthz answered in %s", time.Since(start).Round(time.Millisecond))
		var follower *labcluster.Master
		for _, m := range c.Masters() {
			if m != leader {
				follower = m
			}
		}
		viaFollower, err := c.ClientAs(c.OperatorFiles(), follower.URL())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := viaFollower.Register(ctx, api.RegisterRequest{AgentID: "probe", IP: "198.18.7.9"}); err != nil {
			t.Fatalf("a write forwarded by %s behind 1,000 idle connections on %s: %v", follower.ID, leader.ID, err)
		}
		if err := viaFollower.DeleteAgent(ctx, "probe"); err != nil {
			t.Fatal(err)
		}
		waitMetricAbove(ctx, t, "idle connections closed by the leader (evicted or at their handshake deadline)", closed, 1000-1000/8, closedByServer)
	})

	step("attack 6: h3's certificate is revoked", func(t *testing.T) {
		ctx := within(t, 2*converge)
		id := h3.AgentID()
		refused, err := mastersMetric(ctx, c, `carve_master_revoked_refusals_total{where="api"}`)
		if err != nil {
			t.Fatal(err)
		}
		before, err := c.Client().Agent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		clusterID := st.ClusterID
		args := append([]string{"certs", "revoke", "--dir", c.PKIDir(), "--name", h3.CertName(), "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
		out, err := c.RunCarve(ctx, h1, args...)
		if err != nil || !strings.Contains(string(out), "deleted agent "+id) {
			t.Fatalf("carve certs revoke: %v\n%s", err, out)
		}
		// h3's agent tries again and is refused; its record stays deleted.
		waitMetricAbove(ctx, t, "revoked refusals on the API", refused, 1, func() (float64, error) {
			return mastersMetric(ctx, c, `carve_master_revoked_refusals_total{where="api"}`)
		})
		if _, err := c.Client().Agent(ctx, id); !api.IsCode(err, api.CodeNotFound) {
			t.Errorf("the revoked agent's record: %v, want not found", err)
		}
		st, err = c.State(ctx)
		if err != nil || len(st.Revoked) != 1 || st.Revoked[0].Identity != "agent/"+h3.CertName() {
			t.Fatalf("the state's deny list: %+v %v", st.Revoked, err)
		}
		waitKernelMatchesMasters(ctx, t, c)
		h3Client, err := c.ClientAs(c.AgentFiles(h3))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h3Client.Register(ctx, api.RegisterRequest{AgentID: id, IP: h3.IP().Addr().String()}); !api.IsCode(err, api.CodeRevoked) {
			t.Errorf("the revoked certificate registers: %v, want 401 revoked", err)
		}
		// h3's agent says what happened and what fixes it.
		const revokedLine = "the masters revoked this agent's certificate"
		if err := retry.Until(ctx, 200*time.Millisecond, func() error {
			if !strings.Contains(h3.Agent.Tail(200), revokedLine) {
				return fmt.Errorf("h3's agent has not logged %q", revokedLine)
			}
			return nil
		}); err != nil {
			t.Fatalf("%v:\n%s", err, h3.Agent.Tail(20))
		}
		for _, h := range []*labcluster.Host{h1, h2} {
			if _, err := c.Client().Agent(ctx, h.AgentID()); err != nil {
				t.Errorf("%s after the revocation: %v", h.Name, err)
			}
		}
		// The host is given a new certificate: reloaded (no restart), its
		// agent registers again and every kernel routes it.
		if err := c.IssueAgentCertificate(h3); err != nil {
			t.Fatal(err)
		}
		if err := c.Reload(ctx, h3.Agent); err != nil {
			t.Fatal(err)
		}
		var back *api.AgentInfo
		if err := retry.Until(ctx, 200*time.Millisecond, func() error {
			back, err = c.Client().Agent(ctx, id)
			return err
		}); err != nil {
			t.Fatalf("h3, reloaded with a new certificate, did not register again: %v\n%s", err, h3.Agent.Tail(20))
		}
		if back.Version <= st.Revoked[0].Index {
			t.Fatalf("h3's record after the new certificate has version %d, not above the revocation's index %d", back.Version, st.Revoked[0].Index)
		}
		waitKernelMatchesMasters(ctx, t, c)
		// The operator's next step here: the host's agent is stopped, and
		// the host replays what it held before the revocation.
		if err := c.StopAgent(ctx, h3); err != nil {
			t.Fatal(err)
		}
		// The host still holds the mesh password: it gossips its last
		// record, signed by the masters before the revocation. Every agent
		// refuses it (counted) and keeps h3 out.
		msg, err := json.Marshal(membership.Message{ClusterID: clusterID, State: membership.State{Records: []membership.PeerRecord{membership.NewPeerRecord(before)}}})
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "revoked-record.json")
		if err := os.WriteFile(file, msg, 0o644); err != nil {
			t.Fatal(err)
		}
		const revokedGossip = `carve_agent_gossip_refused_total{reason="revoked"}`
		floors := map[string]float64{}
		for _, h := range []*labcluster.Host{h1, h2} {
			if floors[h.Name], err = agentMetric(ctx, c, h, revokedGossip); err != nil {
				t.Fatal(err)
			}
		}
		rogue, err := c.StartRogue(h3, "revoked-h3", true, file)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []*labcluster.Host{h1, h2} {
			waitMetricAbove(ctx, t, h.Name+" "+revokedGossip, floors[h.Name], 1, func() (float64, error) { return agentMetric(ctx, c, h, revokedGossip) })
			peers, err := c.AgentClient(h).Peers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range peers.Peers {
				if p.AgentID == id && p.Version <= st.Revoked[0].Index {
					t.Errorf("%s's membership took back h3's record of version %d, signed before its certificate was revoked at %d", h.Name, p.Version, st.Revoked[0].Index)
				}
			}
		}
		if err := rogue.Stop(ctx, 0); err != nil {
			t.Error(err)
		}
		waitKernelMatchesMasters(ctx, t, c)
	})

	step("attack 4: h1 grows beyond its quota", func(t *testing.T) {
		ctx := within(t, converge)
		before := viewCluster(ctx, t, c)
		refused, err := mastersMetric(ctx, c, `carve_master_quota_refusals_total{write="grow"}`)
		if err != nil {
			t.Fatal(err)
		}
		grown := 0
		for ; grown < 100; grown++ {
			_, err = evil.Grow(ctx, h1.AgentID(), api.GrowRequest{Overlay: "carve", Bridge: api.BridgeMesos, Family: "4"})
			if err != nil {
				break
			}
		}
		if grown != 4 || !api.IsCode(err, api.CodeQuota) || !strings.Contains(err.Error(), "quota of a /23") {
			t.Fatalf("h1 grew %d blocks, then %v; want 4, then 409 quota naming the /23", grown, err)
		}
		waitMetricAbove(ctx, t, "grow quota refusals", refused, 1, func() (float64, error) {
			return mastersMetric(ctx, c, `carve_master_quota_refusals_total{write="grow"}`)
		})
		before.unchanged(ctx, t, c, h1.AgentID())
		late, err := c.Client().Register(ctx, api.RegisterRequest{AgentID: "late", IP: "198.18.7.7"})
		if err != nil || late.Overlay("carve") == nil || late.Overlay("carve").Subnet == "" || len(late.NotLeased) > 0 {
			t.Fatalf("an agent registered after the attack: %+v %v, want a subnet", late, err)
		}
		if err := c.Client().DeleteAgent(ctx, "late"); err != nil {
			t.Fatal(err)
		}
		// What h1 grew is routed to h1 everywhere, and no address is held
		// twice.
		rec, err := c.Client().Agent(ctx, h1.AgentID())
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range rec.Overlay("carve").Blocks {
			if b.Origin == api.BlockGrown {
				waitRoutedEverywhere(ctx, t, c, h1, netip.MustParsePrefix(b.Prefix))
			}
		}
		st, err := c.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := disjointBlocks(st, "carve"); err != nil {
			t.Error(err)
		}
	})
}
