package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/testutil"
)

func TestGrowthThroughRing(t *testing.T) {
	c := newCluster(t, 1, GrowthConfig{IdleReturn: -1})
	for _, id := range []string{"a", "b", "c"} {
		c.start(id, t.TempDir(), "")
	}
	c.gossipRounds()
	first := netip.MustParsePrefix("10.128.0.0/27")
	a := c.nodes["a"]
	var grown []*api.Allocation
	for i := range 45 {
		al := a.alloc(t, fmt.Sprint("c", i))
		p, gw := v4(t, al)
		if !first.Contains(p.Addr()) {
			grown = append(grown, al)
			if p.Bits() <= first.Bits() || gw != blockaddr.Gateway(p.Masked()) || p.Addr() == gw {
				t.Fatalf("%s in a granted block has gateway %s", p, gw)
			}
		}
	}
	if len(grown) < 45-29 {
		t.Fatalf("%d addresses outside the first block, want %d", len(grown), 45-29)
	}
	c.gossipRounds()
	c.checkNoDoubles()
	// Every agent's ring gives the granted addresses to a.
	for _, al := range grown {
		p, _ := v4(t, al)
		for id, nd := range c.nodes {
			nd.svc.mu.Lock()
			owner, _ := nd.svc.overlays["carve"].Alloc[0].Ring().Owner(p.Addr())
			nd.svc.mu.Unlock()
			if owner != "a" {
				t.Fatalf("%s's ring gives %s to %q", id, p.Addr(), owner)
			}
		}
	}
	st := a.svc.Status("carve")
	if len(st.Blocks[api.BridgeMesos]) < 2 || st.Blocks[api.BridgeMesos][1].Origin != OriginGrant || st.Blocks[api.BridgeMesos][1].Used == 0 {
		t.Fatalf("status blocks %+v", st.Blocks)
	}
	testutil.Eventually(t, 10*time.Second, "the grants reported to the masters", func() error {
		if n := len(c.masters.reported()); n < len(st.Blocks[api.BridgeMesos])-1 {
			return fmt.Errorf("%d reported", n)
		}
		return nil
	})
	for _, g := range c.masters.reported() {
		if g.Recipient != "a" || g.Donor == "a" || g.Donor == "" {
			t.Errorf("report %+v", g)
		}
	}
	if got := counterValue(t, a.reg, "carve_agent_ipam_grants_received_total"); got < 1 {
		t.Errorf("grants received %v", got)
	}
	// The donors' own allocations never land in what they gave away.
	for _, id := range []string{"b", "c"} {
		for i := range 20 {
			c.nodes[id].alloc(t, fmt.Sprint(id, i))
		}
	}
	c.gossipRounds()
	c.checkNoDoubles()
}

// counterValue sums a counter's values over its labels.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestGrowthSurvivesRestarts: a grant survives the restart of its
// recipient and of its donor (bbolt), and after the recipient's data dir is
// lost its containers' addresses in the granted block come back from the
// CNI cache and the ring's gossip; nothing is handed out twice.
func TestGrowthSurvivesRestarts(t *testing.T) {
	c := newCluster(t, 3, GrowthConfig{IdleReturn: -1})
	dirs := map[string]string{"a": t.TempDir(), "b": t.TempDir()}
	cache := t.TempDir()
	c.start("a", dirs["a"], cache)
	c.start("b", dirs["b"], "")
	c.gossipRounds()
	a := c.nodes["a"]
	held := map[string]string{}
	for i := range 35 {
		cid := fmt.Sprint("c", i)
		al := a.alloc(t, cid)
		held[cid] = al.IPs[0].Address
		writeCacheEntry(t, cache, cid, al.IPs[0].Address) // the runtime's cache, as libcni writes it
	}
	c.gossipRounds()
	check := func(what string) {
		t.Helper()
		a := c.nodes["a"]
		for cid, want := range held {
			got, err := a.svc.Lookup(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0"})
			if err != nil || got.IPs[0].Address != want {
				t.Fatalf("%s: %s holds %v (%v), want %s", what, cid, got, err, want)
			}
		}
		c.checkNoDoubles()
	}
	check("before restarts")
	c.start("a", dirs["a"], cache)
	c.gossipRounds()
	check("after the recipient restarted")
	c.start("b", dirs["b"], "")
	c.gossipRounds()
	for i := range 20 {
		c.nodes["b"].alloc(t, fmt.Sprint("b", i))
	}
	check("after the donor restarted")
	// The recipient's data dir is lost.
	c.stop("a")
	if err := os.Remove(filepath.Join(dirs["a"], "agent.db")); err != nil {
		t.Fatal(err)
	}
	c.start("a", dirs["a"], cache)
	c.gossipRounds()
	check("after the recipient lost its data dir")
	for i := range 5 {
		c.nodes["a"].alloc(t, fmt.Sprint("new", i))
	}
	c.checkNoDoubles()
}

// TestGrowthIdleReturn: a granted block that holds no allocation for the
// idle time goes back to its donor through the ring; the first block never.
func TestGrowthIdleReturn(t *testing.T) {
	c, _ := grantedCluster(t, 4, GrowthConfig{IdleReturn: 50 * time.Millisecond})
	a := c.nodes["a"]
	// The masters record the grant (a's report): only then does a lease
	// the block, and only the lessee's word gives it back.
	reports := c.masters.reported()
	if len(reports) != 1 {
		t.Fatalf("grants reported %+v, want one", reports)
	}
	recordGrant(t, c, reports[0])
	// The masters' table was restored once (epoch 4): the return names
	// the epoch and version of the record that listed the grant.
	a.svc.mu.Lock()
	v := a.svc.view
	a.svc.mu.Unlock()
	v.RestoreEpoch = 4
	a.svc.Sync(v)
	for i := range 32 {
		if _, err := a.svc.Release(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("c", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the idle grant given back", func() error {
		if bs := a.svc.Status("carve").Blocks[api.BridgeMesos]; len(bs) != 1 || bs[0].Prefix != "10.128.0.0/27" {
			return fmt.Errorf("blocks %+v", bs)
		}
		return nil
	})
	// The return names the grant's lease, so that the masters refuse it
	// when a restore took the grant back and the donor granted the block
	// to a anew (master/state's TestStaleReturnAfterRestore).
	want := ReturnReport{Overlay: "carve", Prefix: reports[0].Prefix, Version: v.Blocks[0].Version, RestoreEpoch: 4}
	testutil.Eventually(t, 10*time.Second, "the return reported naming its lease", func() error {
		c.masters.mu.Lock()
		defer c.masters.mu.Unlock()
		for _, r := range c.masters.returns {
			if r.RequestID = ""; r == want {
				return nil
			}
		}
		return fmt.Errorf("returns reported %+v, want %+v", c.masters.returns, want)
	})
	c.gossipRounds()
	b := c.nodes["b"]
	b.svc.mu.Lock()
	owned := b.svc.overlays["carve"].Alloc[0].Ring().Blocks("b")
	b.svc.mu.Unlock()
	if fmt.Sprint(owned) != "[10.128.0.64/26]" {
		t.Errorf("b owns %v after the return, want its whole lease back", owned)
	}
	if got := counterValue(t, a.reg, "carve_agent_ipam_blocks_returned_total"); got < 1 {
		t.Errorf("blocks returned %v", got)
	}
	// Until the masters take the return, a's record still lists the
	// grant: a sync with it must not take the block back, only for the
	// ring to drop it again (a warning and two writes at every sync for
	// as long as the masters are away).
	stale := []MasterBlock{{Overlay: "carve", Bridge: api.BridgeMesos, Prefix: reports[0].Prefix, Version: 1, Donor: reports[0].Donor}}
	a.svc.mu.Lock()
	writes := a.svc.overlays["carve"].LearnMasterBlocks("a", stale, a.svc.grow.returned)
	a.svc.mu.Unlock()
	if len(writes) != 0 {
		t.Errorf("a stale record took the grant given back to %s back: %d writes", reports[0].Donor, len(writes))
	}
}

// TestGrowthFromMasters: a block the masters lease (the stand-in's Grow
// answering one) becomes a block of the bridge, in the ring as a lease.
func TestGrowthFromMasters(t *testing.T) {
	c := newCluster(t, 5, GrowthConfig{IdleReturn: -1})
	src := &leasingStandIn{next: netip.MustParsePrefix("10.128.0.192/27")}
	nd := c.startSource("a", t.TempDir(), src)
	for i := range 31 {
		nd.alloc(t, fmt.Sprint("c", i))
	}
	st := nd.svc.Status("carve")
	if bs := st.Blocks[api.BridgeMesos]; len(bs) != 2 || bs[1].Prefix != "10.128.0.192/27" || bs[1].Origin != OriginGrow {
		t.Fatalf("blocks %+v", bs)
	}
	if gws := nd.svc.BridgeGateways("carve", api.BridgeMesos); fmt.Sprint(gws) != "[10.128.0.193/27]" {
		t.Errorf("gateways %v", gws)
	}
}

// TestReturnedAtTheRecordsVersion: a grown block held at the version it
// was leased at, which a later record lists at a newer one (the masters
// re-version an agent's blocks when it registers again after a delete),
// is given back. A record that still lists it at that version, until the
// masters take the return, must not give it back to the agent: the
// version remembered is the record's (seed 158195 of
// TestGrowthInvariantAcrossAgents handed out addresses there). The return
// names that version and the masters' restore epoch of the record to the
// masters, which refuse it when a restore took the lease back and the
// agent was leased the block anew meanwhile (master/state's
// TestStaleReturnAfterRestore).
func TestReturnedAtTheRecordsVersion(t *testing.T) {
	c := newCluster(t, 5, GrowthConfig{IdleReturn: -1})
	src := &leasingStandIn{next: netip.MustParsePrefix("10.128.0.192/27")}
	nd := c.startSource("a", t.TempDir(), src)
	for i := range 31 {
		nd.alloc(t, fmt.Sprint("c", i))
	}
	grown := netip.MustParsePrefix("10.128.0.192/27")
	v := growthView("a")
	v.Self.Version, v.RestoreEpoch = 150, 9
	v.Blocks = []MasterBlock{{Overlay: "carve", Bridge: api.BridgeMesos, Prefix: grown, Version: 150}}
	nd.svc.Sync(v)
	for i := range 31 {
		if _, err := nd.svc.Release(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("c", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	nd.svc.mu.Lock()
	o := nd.svc.overlays["carve"]
	hb := o.Held(0, grown)
	nd.svc.mu.Unlock()
	if hb == nil || hb.Version != 100 {
		t.Fatalf("the grown block held: %+v, want it at the version it was leased at (100)", hb)
	}
	nd.svc.giveBack(hb)
	nd.svc.mu.Lock()
	writes := o.LearnMasterBlocks("a", v.Blocks, nd.svc.grow.returned)
	held := o.Held(0, grown)
	nd.svc.mu.Unlock()
	if held != nil || len(writes) != 0 {
		t.Fatalf("a record listing the block given back at version 150 gave it back to the agent (%d writes)", len(writes))
	}
	// The report the agent's reporter sends (sourceReports.Return).
	outbox, err := (*reportHost)(nd.svc).Outbox()
	if err != nil {
		t.Fatal(err)
	}
	want := ReturnReport{Overlay: "carve", Prefix: grown, Version: 150, RestoreEpoch: 9}
	var sent []ReturnReport
	for _, e := range outbox {
		if err := (sourceReports{src}).Return(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	src.mu.Lock()
	for _, r := range src.returns {
		r.RequestID = ""
		sent = append(sent, r)
	}
	src.mu.Unlock()
	if !slices.Contains(sent, want) {
		t.Errorf("the return reports %+v, want %+v", sent, want)
	}
}

// leasingStandIn is a TEST DOUBLE standing in for the masters that lease
// one block (the masters' grow route is another change's).
type leasingStandIn struct {
	mastersStandIn
	next netip.Prefix
}

func (m *leasingStandIn) Grow(context.Context, string, string, int, string) (LeasedBlock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.next.IsValid() {
		return LeasedBlock{}, ErrMastersExhausted
	}
	p := m.next
	m.next = netip.Prefix{}
	return LeasedBlock{Prefix: p, Version: 100}, nil
}

func (c *cluster) startSource(id, dir string, src BlockSource) *node {
	c.t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	t := c.t
	t.Cleanup(func() { db.Close() })
	cfg := c.growth
	cfg.Source = src
	svc, err := New(Config{AgentID: id, DB: db, Registerer: prometheus.NewRegistry(), Logger: testLogger(), Growth: cfg, ClaimKey: claimKeyOf(id)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close) // before the store closes: growths in flight end
	svc.Sync(growthView(id))
	return &node{id: id, dir: dir, db: db, svc: svc}
}

// TestDonorRestartRemembersGrants: a donor that granted a block and
// restarted answers the same request again (a recipient's resend) with the
// same block, never a second one: the request id is persisted with the
// grant.
func TestDonorRestartRemembersGrants(t *testing.T) {
	c := newCluster(t, 5, GrowthConfig{IdleReturn: -1})
	dir := t.TempDir()
	c.start("b", dir, "")
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: "c1", From: "a", ID: "a-0001", Overlay: "carve", Family: "4", Bits: 27}
	grant := func(what string) netip.Prefix {
		t.Helper()
		nd := c.nodes["b"]
		ans, b := nd.svc.decideDonation(req)
		if b != nil {
			if err := nd.svc.commits.Flush(b); err != nil {
				t.Fatal(err)
			}
		}
		if ans.Kind != ipamwire.KindGrant {
			t.Fatalf("%s: answer %+v", what, ans)
		}
		return netip.MustParsePrefix(ans.Prefix)
	}
	grantedToA := func() []netip.Prefix {
		t.Helper()
		var out []netip.Prefix
		for _, p := range c.nodes["b"].svc.overlays["carve"].Alloc[0].Ring().Blocks("a") {
			if netip.MustParsePrefix("10.128.0.64/26").Contains(p.Addr()) {
				out = append(out, p)
			}
		}
		return out
	}
	first := grant("first request")
	if again := grant("the same request"); again != first {
		t.Fatalf("a repeated request got %v, then %v", first, again)
	}
	c.start("b", dir, "") // restart
	if again := grant("the same request after a restart"); again != first {
		t.Fatalf("after a restart the repeated request got %v, first %v", again, first)
	}
	if got := grantedToA(); len(got) != 1 || got[0] != first {
		t.Fatalf("b granted a %v, want only %v", got, first)
	}
}

// watchFirstStandIn is a TEST DOUBLE for the masters whose watch brings
// the agent's new record (with the grown block) before the grow's answer
// does, as the real masters' watch may.
type watchFirstStandIn struct {
	leasingStandIn
	svc *Service
	id  string
}

func (m *watchFirstStandIn) Grow(ctx context.Context, overlay, bridge string, family int, rid string) (LeasedBlock, error) {
	lb, err := m.leasingStandIn.Grow(ctx, overlay, bridge, family, rid)
	if err == nil {
		v := growthView(m.id)
		v.Blocks = []MasterBlock{{Overlay: overlay, Bridge: bridge, Prefix: lb.Prefix, Version: lb.Version}}
		m.svc.Sync(v)
	}
	return lb, err
}

// TestGrowthAnswerAfterWatch: the grown block the watch brought first is
// the grow's answer too: the bridge uses it, and does not go asking peers
// for space it already has.
func TestGrowthAnswerAfterWatch(t *testing.T) {
	c := newCluster(t, 5, GrowthConfig{IdleReturn: -1})
	src := &watchFirstStandIn{leasingStandIn: leasingStandIn{next: netip.MustParsePrefix("10.128.0.192/27")}, id: "a"}
	nd := c.startSource("a", t.TempDir(), src)
	src.svc = nd.svc
	for i := range 31 {
		nd.alloc(t, fmt.Sprint("c", i))
	}
	st := nd.svc.Status("carve")
	if bs := st.Blocks[api.BridgeMesos]; len(bs) != 2 || bs[1].Prefix != "10.128.0.192/27" || bs[1].Origin != OriginGrow {
		t.Fatalf("blocks %+v", bs)
	}
	// The growth may have started in the background (low water): the
	// watch made the block usable before the grow's answer came back, so
	// the answer may still be on its way when the last ADD returns.
	grows := func(result string) float64 {
		var m dto.Metric
		if err := nd.svc.metrics.Grows.WithLabelValues("master", result).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	testutil.Eventually(t, 10*time.Second, "the grow's answer handled", func() error {
		if grows("ok")+grows("error") == 0 {
			return errors.New("the grow has not ended")
		}
		return nil
	})
	if n := grows("ok"); n != 1 {
		t.Errorf("grows from the masters that succeeded: %v, want 1 (the answer was refused as a block the bridge holds)", n)
	}
}

// quotaStandIn is a TEST DOUBLE standing in for the masters of an agent
// that holds its quota: every grow is refused with ErrQuota, as the
// agent's BlockSource maps the masters' 409 quota.
type quotaStandIn struct{ mastersStandIn }

func (m *quotaStandIn) Grow(context.Context, string, string, int, string) (LeasedBlock, error) {
	return LeasedBlock{}, fmt.Errorf("%w: %w", ErrQuota, &api.Error{Status: http.StatusConflict, Code: api.CodeQuota,
		Message: `agent "a" would hold more than its quota of a /23: return blocks it no longer needs, or raise the overlay's quota_prefix in the network configuration`})
}

// TestGrowthStopsAtQuota: an agent the masters refuse for its quota asks no
// peer for space (a grant would be refused by the masters just the same,
// and the donor's space would serve an agent beyond its cap): the ADD that
// finds its bridge full fails with 409 quota naming the fix, and no peer
// granted anything.
func TestGrowthStopsAtQuota(t *testing.T) {
	c := newCluster(t, 6, GrowthConfig{IdleReturn: -1})
	c.source = func(string) BlockSource { return &quotaStandIn{} }
	for _, id := range []string{"a", "b"} {
		c.start(id, t.TempDir(), "")
	}
	c.gossipRounds()
	a := c.nodes["a"]
	for i := range 29 {
		a.alloc(t, fmt.Sprint("c", i))
	}
	_, err := a.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "more", IfName: "eth0", Bridge: api.BridgeMesos})
	if !api.IsCode(err, api.CodeQuota) || !strings.Contains(err.Error(), "quota_prefix") || !strings.Contains(err.Error(), "a /23") {
		t.Fatalf("the ADD beyond the quota: %v; want 409 quota naming the cap and quota_prefix", err)
	}
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict {
		t.Fatalf("status of %v: want 409", err)
	}
	c.gossipRounds()
	if got := counterValue(t, c.nodes["b"].reg, "carve_agent_ipam_grants_given_total"); got != 0 {
		t.Errorf("b granted %v blocks to an agent at its quota", got)
	}
	if got, _ := gaugeIn(t, a.reg, "carve_agent_ipam_grows_total", map[string]string{"path": "ring"}); got != 0 {
		t.Errorf("a asked peers %v times", got)
	}
	if got, _ := gaugeIn(t, a.reg, "carve_agent_ipam_grow_refused_total", map[string]string{"reason": "quota"}); got < 1 {
		t.Errorf("grow_refused_total{reason=quota} %v", got)
	}
}

// TestDonorsKeepToTheRecipientsQuota: peers grant an agent no more than
// its quota of grown and granted space (quota_prefix, here a /28 beyond
// its /26), counting what their rings give it: an agent that asks again
// beyond it, as a hostile host would (this one's masters stand-in answers
// exhausted, never quota), is refused, and the refusals are counted.
func TestDonorsKeepToTheRecipientsQuota(t *testing.T) {
	c := newCluster(t, 7, GrowthConfig{IdleReturn: -1, RefuseMemory: time.Millisecond})
	quotaView := func(id string) View {
		v := growthView(id)
		v.Self.Overlays[0].Info.QuotaPrefix = 28
		return v
	}
	for _, id := range []string{"a", "b", "c"} {
		c.start(id, t.TempDir(), "").svc.Sync(quotaView(id))
	}
	c.gossipRounds()
	a := c.nodes["a"]
	var err error
	for i := 0; i < 64 && err == nil; i++ {
		_, err = a.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("c", i), IfName: "eth0", Bridge: api.BridgeMesos})
	}
	if !api.IsCode(err, api.CodeExhausted) {
		t.Fatalf("the last ADD: %v; want exhausted", err)
	}
	c.gossipRounds()
	c.checkNoDoubles()
	for id, nd := range c.nodes {
		nd.svc.mu.Lock()
		blocks := nd.svc.overlays["carve"].Alloc[0].Ring().Blocks("a")
		nd.svc.mu.Unlock()
		var held int
		for _, p := range blocks {
			held += 1 << (32 - p.Bits())
		}
		if held-64 > 16 {
			t.Errorf("%s's ring gives a %d addresses beyond its /26 (%v), more than its quota of 16", id, held-64, blocks)
		}
	}
	refused := 0.0
	for _, id := range []string{"b", "c"} {
		n, _ := gaugeIn(t, c.nodes[id].reg, "carve_agent_ring_claims_refused_total", map[string]string{"reason": ipamwire.ReasonRecipientQuota})
		refused += n
	}
	if refused < 1 {
		t.Errorf("no donor refused a request beyond a's quota")
	}
	if got := counterValue(t, a.reg, "carve_agent_ipam_grants_received_total"); got < 1 {
		t.Errorf("a received %v grants, want at least one (within its quota)", got)
	}
}

// poolStandIn is a TEST DOUBLE standing in for the masters that lease
// blocks from a pool, one a grow, in order.
type poolStandIn struct {
	mastersStandIn
	pool []netip.Prefix
	v    uint64
}

func (m *poolStandIn) Grow(context.Context, string, string, int, string) (LeasedBlock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.pool) == 0 {
		return LeasedBlock{}, ErrMastersExhausted
	}
	p := m.pool[0]
	m.pool, m.v = m.pool[1:], m.v+1
	return LeasedBlock{Prefix: p, Version: 100 + m.v}, nil
}

// TestConcurrentADDsOnAFullBridge: ADDs that find their bridge full at
// once wait for the same growth, and only one of them gets what a /30 (one
// address) brings: the others grow again rather than fail "exhausted"
// while the masters still have blocks.
func TestConcurrentADDsOnAFullBridge(t *testing.T) {
	c := newCluster(t, 8, GrowthConfig{IdleReturn: -1})
	src := &poolStandIn{}
	for i := range 16 {
		src.pool = append(src.pool, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, 0, byte(192 + 4*i)}), 30))
	}
	nd := c.startSource("a", t.TempDir(), src)
	for i := range 29 {
		nd.alloc(t, fmt.Sprint("c", i))
	}
	const adds = 12
	errs := make(chan error, adds)
	var wg sync.WaitGroup
	for i := range adds {
		wg.Go(func() {
			_, err := nd.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("more", i), IfName: "eth0", Bridge: api.BridgeMesos})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("an ADD on a full bridge, with blocks left at the masters: %v", err)
		}
	}
	checkAllocations(t, nd.svc)
}
