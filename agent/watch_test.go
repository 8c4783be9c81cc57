package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// cutProxy passes requests to a master until it is cut: then every answer,
// even one the master already gave, is replaced by a 503, and the changes
// streams it passes end, so the agent behind it hears nothing of what
// happens meanwhile.
type cutProxy struct {
	srv *httptest.Server
	cut atomic.Bool

	mu       sync.Mutex
	inflight map[*http.Request]context.CancelFunc
}

// setCut cuts the proxy (true), ending what it passes, or mends it.
func (p *cutProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if cut {
		p.mu.Lock()
		for _, cancel := range p.inflight {
			cancel()
		}
		p.mu.Unlock()
	}
}

var errCut = errors.New("cut")

func newCutProxy(t *testing.T, m *master.Master) *cutProxy {
	t.Helper()
	u, err := url.Parse("http://" + m.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(*http.Response) error {
		if p.cut.Load() {
			return errCut
		}
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, err.Error())
	}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.cut.Load() {
			httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "cut")
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		p.mu.Lock()
		if p.inflight == nil {
			p.inflight = map[*http.Request]context.CancelFunc{}
		}
		p.inflight[r] = cancel
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.inflight, r)
			p.mu.Unlock()
		}()
		rp.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func masterReads(t *testing.T, a *Agent, kind string) float64 {
	t.Helper()
	return counterValue(t, a.metrics.masterReads.WithLabelValues(kind))
}

// sameAsMasters says how a membership differs from the masters' state:
// the same records (id, version, signature) and tombstones, nothing more.
func sameAsMasters(m membership.State, st *api.State) error {
	var want, got []string
	for i := range st.Agents {
		a := &st.Agents[i]
		want = append(want, fmt.Sprintf("%s@%d/%s", a.AgentID, a.Version, a.Signature))
	}
	for _, r := range m.Records {
		got = append(got, fmt.Sprintf("%s@%d/%s", r.ID, r.Version, r.Signature))
	}
	for _, tb := range st.Tombstones {
		want = append(want, fmt.Sprintf("tombstone %s@%d", tb.AgentID, tb.Version))
	}
	for _, tb := range m.Tombstones {
		got = append(got, fmt.Sprintf("tombstone %s@%d", tb.AgentID, tb.Version))
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		return fmt.Errorf("membership %v, masters' state %v", got, want)
	}
	return nil
}

// TestWatcherBehindHorizonResyncs: an agent follows the masters' changes;
// it is cut off from them while an agent it knows is deleted and the
// tombstone compacted (and another agent registers). When it hears from
// the masters again, the changes since its index are gone (410): it reads
// the whole state and ends with exactly the masters' records and
// tombstones; the deleted agent is out of its membership and its kernel.
// Then a peer gossips the deleted agent's old signed record: the agent
// does not take it back (compacted tombstone, late gossip).
func TestWatcherBehindHorizonResyncs(t *testing.T) {
	hosts, dir, _ := hostsWithMaster(t, 1)
	_, key := testKey(t)
	m := mastertest.StartSigning(t, filepath.Join(dir, "signing-m1"), state.DefaultConfig(), quietLogger(), key, func(o *master.Options) {
		o.TombstoneMaxAge, o.CompactEvery = 500*time.Millisecond, 50*time.Millisecond
	})
	op := masterClient(t, m)
	ctx := context.Background()
	ghostInfo, err := op.Register(ctx, api.RegisterRequest{AgentID: "ghost", IP: "198.18.9.1", MeshAddr: "198.18.9.1:6783"})
	if err != nil {
		t.Fatal(err)
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 41, GossipInterval: 200 * time.Millisecond})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	proxy := newCutProxy(t, m)
	a := startAgent(t, hosts[0], proxy.srv.URL, filepath.Join(dir, "a0"), gnet)
	testutil.Eventually(t, 0, "the agent programs ghost", testutil.True(func() bool { return programmedPeers(a.Agent)["ghost"] }))
	// One more registration: the agent learns it through the changes.
	if _, err := op.Register(ctx, api.RegisterRequest{AgentID: "early", IP: "198.18.9.2"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the agent programs early from the changes", testutil.True(func() bool {
		return programmedPeers(a.Agent)["early"] && masterReads(t, a.Agent, "changes") > 0
	}))
	goneBefore := masterReads(t, a.Agent, "gone")

	proxy.setCut(true)
	if err := op.DeleteAgent(ctx, "ghost"); err != nil {
		t.Fatal(err)
	}
	tv, ok := m.Table().Tombstone("ghost")
	if !ok {
		t.Fatal("no tombstone of ghost after its delete")
	}
	if _, err := op.Register(ctx, api.RegisterRequest{AgentID: "late", IP: "198.18.9.3"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the masters compact ghost's tombstone", func() error {
		if _, ok := m.Table().Tombstone("ghost"); ok || m.Table().Horizon() < tv {
			return fmt.Errorf("horizon %d, tombstone at %d", m.Table().Horizon(), tv)
		}
		return nil
	})
	if _, ok := a.members.Record("ghost"); !ok {
		t.Fatal("the agent lost ghost while cut off: the test shows nothing")
	}
	proxy.setCut(false)

	testutil.Eventually(t, 0, "the agent ends with exactly the masters' state", func() error {
		if masterReads(t, a.Agent, "gone") <= goneBefore {
			return errors.New("no 410 from the changes yet")
		}
		if err := sameAsMasters(a.members.State(), masterState(t, m)); err != nil {
			return err
		}
		p := programmedPeers(a.Agent)
		if p["ghost"] || !p["late"] || !p["early"] {
			return fmt.Errorf("programmed %v: want early and late, not ghost", p)
		}
		return nil
	})
	if h := a.members.Horizon(); h < tv {
		t.Fatalf("the agent's horizon %d is below ghost's tombstone %d", h, tv)
	}

	// Late gossip of ghost's genuine, signed record changes nothing.
	if ghostInfo.Version > tv {
		t.Fatalf("ghost's record (version %d) is newer than its tombstone (%d)", ghostInfo.Version, tv)
	}
	old := membership.NewPeerRecord(ghostInfo)
	if old.Signature == "" {
		t.Fatal("the master did not sign ghost's record")
	}
	msg, err := json.Marshal(membership.Message{ClusterID: m.Table().ClusterID(), State: membership.State{Records: []membership.PeerRecord{old}}})
	if err != nil {
		t.Fatal(err)
	}
	known := gossipCount(t, a.Agent, "known")
	peer, err := gnet.Join("late-gossip")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Channel(GossipChannel, parrot{msg}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the agent hears the late gossip twice", testutil.True(func() bool {
		return gossipCount(t, a.Agent, "known") >= known+2
	}))
	if _, ok := a.members.Record("ghost"); ok {
		t.Fatal("late gossip brought the compacted agent ghost back")
	}
	if programmedPeers(a.Agent)["ghost"] {
		t.Fatal("late gossip had ghost programmed again")
	}
}
