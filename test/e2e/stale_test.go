package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// TestLoneMasterAfterOutage (issue 12): every master is killed, and one
// comes back alone. Without a quorum it cannot catch up: what it can serve
// is behind what the agents have seen (it answers 503 until it has caught
// up; a master without that fix serves the empty state of its snapshot,
// index 0). The agents must not take it for a rebuilt cluster:
//
//  1. every agent keeps its peers (GET /overlay-agent/peers) and its kernel
//     keeps every other agent's entries, and the containers still ping;
//  2. an agent restarted meanwhile (a host reboot: SIGKILL, its VTEP gone
//     with the host's kernel state, started again on its data dir) programs
//     everything back from its disk;
//  3. once the other masters are back, everything converges with the
//     masters' state, in the same cluster (the same cluster_id).
func TestLoneMasterAfterOutage(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 4, Masters: 3, Prefix: prefix})
	ctx := within(t, 5*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	containers := containerPerHost(ctx, t, c)
	waitKernelMatchesMasters(ctx, t, c)
	st, err := c.State(ctx) // the masters' last word
	if err != nil {
		t.Fatal(err)
	}
	clusterID := st.ClusterID
	if clusterID == "" {
		t.Errorf("the masters serve no cluster_id")
	}
	before := map[string]*api.AgentPeers{}
	for _, h := range c.Hosts() {
		p, err := c.AgentClient(h).Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.ClusterID != clusterID {
			t.Errorf("%s is in cluster %q, the masters in %q", h.Name, p.ClusterID, clusterID)
		}
		before[h.Name] = p
	}

	for _, m := range c.Masters() {
		if err := c.KillMaster(m); err != nil {
			t.Fatal(err)
		}
	}
	lone := c.Masters()[0]
	if err := c.StartMaster(lone); err != nil {
		t.Fatal(err)
	}
	// Host 4 reboots while only the lone master answers: its agent is
	// killed, and its kernel state goes (the VTEP, and every neighbour, FDB
	// entry and route on it).
	h4 := c.Host(4)
	if err := c.KillAgent(h4); err != nil {
		t.Fatal(err)
	}
	deleteVTEP(t, c, h4)
	if err := c.StartAgent(h4); err != nil {
		t.Fatal(err)
	}
	// The agents read the lone master: each agent has one state watch at a
	// time and tries every master in turn, so once the lone master has
	// answered twice as many reads as there are agents, each agent has had
	// its answers (a stale state after a long poll, or a 503).
	reads := &readCounter{c: c, m: lone}
	err = retry.Until(ctx, time.Second, func() error {
		n, err := reads.count(ctx)
		if err != nil {
			return err
		}
		if want := 2 * len(c.Hosts()); n < want {
			return fmt.Errorf("the lone master answered %d reads, want %d", n, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var probs []string
	for _, h := range c.Hosts() {
		if _, err := c.WaitAgent(ctx, h); err != nil {
			t.Fatal(err)
		}
		p, err := c.AgentClient(h).Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := samePeers(p, before[h.Name]); err != nil {
			probs = append(probs, fmt.Sprintf("%s: %v", h.Name, err))
		}
		ks, err := c.Kernel(h)
		if err != nil {
			t.Fatal(err)
		}
		if err := matches(ks, st, h.AgentID()); err != nil {
			probs = append(probs, fmt.Sprintf("%s: %v\n%s", h.Name, err, ks))
		}
	}
	if len(probs) > 0 {
		t.Fatalf("with only the lone master:\n%s", strings.Join(probs, "\n"))
	}
	pingAll(ctx, t, containers)

	// The other masters are back: one cluster again, the same one.
	for _, m := range c.Masters()[1:] {
		if err := c.StartMaster(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	after, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.ClusterID != clusterID {
		t.Errorf("the masters came back in cluster %q, were in %q", after.ClusterID, clusterID)
	}
	for _, h := range c.Hosts() {
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			p, err := c.AgentClient(h).Peers(ctx)
			if err != nil {
				return err
			}
			if !p.MastersReachable || p.MasterIndex < after.Index {
				return fmt.Errorf("%s: masters reachable %v, master index %d, want %d", h.Name, p.MastersReachable, p.MasterIndex, after.Index)
			}
			if p.ClusterID != clusterID {
				return fmt.Errorf("%s is in cluster %q, the masters in %q", h.Name, p.ClusterID, clusterID)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	pingAll(ctx, t, containers)
}

// samePeers compares an agent's peers with what it had: the same agents, at
// the same versions, programmed, and the same master index.
func samePeers(got, want *api.AgentPeers) error {
	if got.MasterIndex != want.MasterIndex {
		return fmt.Errorf("master index %d, had %d", got.MasterIndex, want.MasterIndex)
	}
	have := map[string]api.AgentPeer{}
	for _, p := range got.Peers {
		have[p.AgentID] = p
	}
	if len(have) != len(want.Peers) {
		return fmt.Errorf("%d peers, had %d: %+v", len(have), len(want.Peers), got.Peers)
	}
	for _, w := range want.Peers {
		p, ok := have[w.AgentID]
		switch {
		case !ok:
			return fmt.Errorf("lost peer %s", w.AgentID)
		case p.Version != w.Version:
			return fmt.Errorf("peer %s at version %d, had %d", w.AgentID, p.Version, w.Version)
		case !p.Programmed:
			return fmt.Errorf("peer %s not programmed", w.AgentID)
		}
	}
	return nil
}

// readCounter counts the GET requests a master answered, whatever the
// route and status, from its own metrics, less the metrics scrapes of the
// counter itself: with the other masters down and the harness reading
// nothing else from it, those are the agents' state reads.
type readCounter struct {
	c       *labcluster.Cluster
	m       *labcluster.Master
	scrapes int // answered before the current one
}

func (r *readCounter) count(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.m.URL()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := r.c.HTTPClient().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "carve_master_http_requests_total{") || !strings.Contains(line, `method="GET"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, retry.Permanent(fmt.Errorf("master metrics line %q: %w", line, err))
		}
		n += v
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	own := r.scrapes
	r.scrapes++
	return int(n) - own, nil
}
