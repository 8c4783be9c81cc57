package ipam

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// restoreLab is a real master (in process, --insecure) and the honest
// agent's IPAM on real rings; the rogue has no IPAM: it writes its ring
// messages and its grant statements by hand, with its own claim key.
type restoreLab struct {
	t      *testing.T
	ctx    context.Context
	client *apiclient.Client
	c      *cluster
	st     *api.State
}

// newRestoreLab registers the rogue and the honest agent (mesos bridges
// only) on an overlay 10.128.0.0/24 cut in /26s, and starts the honest
// agent's IPAM on the masters' records.
func newRestoreLab(t *testing.T) *restoreLab {
	t.Helper()
	cfg := state.DefaultConfig()
	cfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/24", Prefix: 26}}
	m := mastertest.Start(t, filepath.Join(t.TempDir(), "m1"), cfg, testLogger())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	client, err := apiclient.NewClientWith([]string{m.URL()}, apiclient.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := &restoreLab{t: t, ctx: ctx, client: client}
	for i, id := range []string{"rogue", "honest"} {
		pub := claimKeyOf(id).Public().(ed25519.PublicKey)
		_, err := client.Register(ctx, api.RegisterRequest{AgentID: id, IP: fmt.Sprintf("198.18.9.%d", i+1),
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}, Keys: api.AgentKeys{Claim: base64.StdEncoding.EncodeToString(pub)}})
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	l.read()
	l.c = newCluster(t, 41, GrowthConfig{IdleReturn: -1})
	l.c.view = func(id string) View { return restoreView(l.st, id) }
	l.c.start("honest", t.TempDir(), "")
	return l
}

// read reads the masters' state.
func (l *restoreLab) read() {
	l.t.Helper()
	st, err := l.client.State(l.ctx, apiclient.StateOptions{Consistent: true})
	if err != nil {
		l.t.Fatal(err)
	}
	l.st = st
}

// sync reads the masters' state and hands the honest agent its view, as
// the agent does after every change of the masters' state.
func (l *restoreLab) sync() {
	l.t.Helper()
	l.read()
	l.c.nodes["honest"].svc.Sync(restoreView(l.st, "honest"))
}

// record is the masters' record of id.
func (l *restoreLab) record(id string) *api.AgentInfo {
	l.t.Helper()
	for i := range l.st.Agents {
		if l.st.Agents[i].AgentID == id {
			return &l.st.Agents[i]
		}
	}
	l.t.Fatalf("the masters hold no record of %s", id)
	return nil
}

// rogueGrants is the rogue's ring message granting p to the honest agent
// through the ring, unasked: signed with its claim key, inside its lease
// set as its record gives it.
func (l *restoreLab) rogueGrants(p netip.Prefix) []byte {
	l.t.Helper()
	rec := l.record("rogue")
	a, err := ring.NewAllocator("rogue", netip.MustParsePrefix("10.128.0.0/24"))
	if err != nil {
		l.t.Fatal(err)
	}
	key := claimKeyOf("rogue")
	a.SetSigner(func(msg []byte) []byte { return ed25519.Sign(key, msg) })
	set := ring.LeaseSet{Owner: "rogue", Version: rec.Version}
	pr := membership.NewPeerRecord(rec)
	for _, s := range pr.LeasePrefixes() {
		set.Prefixes = append(set.Prefixes, netip.MustParsePrefix(s))
	}
	if _, err := a.SeedSets([]ring.LeaseSet{set}, nil); err != nil {
		l.t.Fatal(err)
	}
	if err := a.Grant("honest", p); err != nil {
		l.t.Fatal(err)
	}
	msg, err := json.Marshal(ipamwire.RingMessage{ClusterID: l.st.ClusterID, Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: a.Ring().Claims().Encode()}}})
	if err != nil {
		l.t.Fatal(err)
	}
	return msg
}

// rogueReports has the rogue report, as donor, a grant of p to the honest
// agent with a new statement of its own.
func (l *restoreLab) rogueReports(p netip.Prefix) error {
	g := api.GrantReport{Overlay: "carve", Prefix: p.String(), Donor: "rogue", Recipient: "honest",
		RequestID: api.NewRequestID(), Expires: time.Now().Add(time.Hour).Unix()}
	api.SignGrant(claimKeyOf("rogue"), &g, l.st.ClusterID)
	_, err := l.client.ReportGrant(l.ctx, "rogue", g)
	return err
}

// restoreView is agent id's view of the masters' state, as the agent
// builds it (agent/ipam.go, ipamView): every record's lease set, and its
// own record's grown and granted blocks.
func restoreView(st *api.State, id string) View {
	network := st.Network
	v := View{ClusterID: st.ClusterID, Network: &network, Tombstones: st.Tombstones, StateIndex: st.Index}
	for i := range st.Agents {
		rec := &st.Agents[i]
		pr := membership.NewPeerRecord(rec)
		v.Peers = append(v.Peers, Peer{ID: rec.AgentID, Version: rec.Version, Subnets: pr.LeasePrefixes(), ClaimKey: ParseClaimKey(rec.Keys.Claim)})
		if rec.AgentID != id {
			continue
		}
		v.Self = rec
		for _, ov := range rec.Overlays {
			for _, b := range ov.Blocks {
				p, err := netip.ParsePrefix(b.Prefix)
				if err != nil || b.Origin == api.BlockLeased {
					continue
				}
				mb := MasterBlock{Overlay: ov.Info.Name, Bridge: b.Bridge, Prefix: p, Version: b.Version}
				if b.Origin == api.BlockGranted {
					mb.Donor = b.Donor
				}
				v.Blocks = append(v.Blocks, mb)
			}
		}
	}
	return v
}

// heldOverlapping lists the blocks the honest agent hands addresses out
// from (its IPAM status) that overlap p.
func heldOverlapping(svc *Service, p netip.Prefix) []string {
	var out []string
	for _, bs := range svc.Status("carve").Blocks {
		for _, b := range bs {
			if q, err := netip.ParsePrefix(b.Prefix); err == nil && q.Overlaps(p) {
				out = append(out, b.Prefix)
			}
		}
	}
	return out
}

// TestRestoreTakesBackARecordedGrant is the rogue agent's seed
// 8305642479575876046 (test/e2e/rogue_test.go) with a real master and the
// honest agent's real rings: the rogue grants the honest agent a /27 of
// its space through the ring, unasked (not adopted), then reports to the
// masters a grant of the /28 in its upper half, which the honest agent
// adopts (the records give it) and hands an address out from. The
// operator restores a snapshot saved before into the running cluster: the
// restore keeps the /28 the honest agent's (keep_live), so nothing
// changes for it. A whole-cluster restore of the same snapshot gives the
// /28 back to the rogue: its ring grant of the /27, which the /28's lease
// had shadowed, counts again, so the honest agent's ring still gives it
// the /28; yet the records are the authority. The agent stops handing out
// there, keeps the container's address (isolated: counted, never handed
// out again) and, when the records give it the /28 once more, hands out
// every other address there but that one.
func TestRestoreTakesBackARecordedGrant(t *testing.T) {
	l := newRestoreLab(t)
	honest := l.c.nodes["honest"]
	rogueSub := netip.MustParsePrefix(l.record("rogue").Overlays[0].Subnet)
	unasked := netip.PrefixFrom(rogueSub.Addr(), 27)                                             // the rogue's first /27
	granted := netip.PrefixFrom(blockaddr.Last(netip.PrefixFrom(unasked.Addr(), 28)).Next(), 28) // its upper /28
	snapshot, err := l.client.Snapshot(l.ctx)
	if err != nil {
		t.Fatal(err)
	}
	atSnapshot := l.st // the records the snapshot holds

	if _, err := honest.svc.gossip.Receive("", l.rogueGrants(unasked)); err != nil {
		t.Fatal(err)
	}
	if held := heldOverlapping(honest.svc, unasked); len(held) > 0 {
		t.Fatalf("the honest agent adopted %v from a ring grant it never asked for", held)
	}
	if err := l.rogueReports(granted); err != nil {
		t.Fatalf("the rogue's report of %s: %v", granted, err)
	}
	l.sync()
	if held := heldOverlapping(honest.svc, granted); len(held) != 1 || held[0] != granted.String() {
		t.Fatalf("the honest agent holds %v, want %s (the masters recorded the grant)", held, granted)
	}
	inGrant, inGrantCID := allocIn(t, honest, granted)

	// A restore of that snapshot into the running cluster keeps the /28
	// the honest agent's (the masters leased it after the snapshot, and
	// the honest agent is live): it goes on handing out there.
	if _, err := l.client.RestoreSnapshot(l.ctx, snapshot); err != nil {
		t.Fatal(err)
	}
	l.sync()
	if held := heldOverlapping(honest.svc, granted); len(held) != 1 || held[0] != granted.String() {
		t.Fatalf("after a restore into the running cluster the honest agent holds %v, want %s kept", held, granted)
	}
	if n, _ := gaugeIn(t, honest.reg, "carve_agent_ipam_isolated_addresses", map[string]string{"overlay": "carve"}); n != 0 {
		t.Errorf("carve_agent_ipam_isolated_addresses = %v after a restore that kept the block, want 0", n)
	}
	// A whole-cluster restore of it (--restore-from onto empty data
	// directories) knows nothing of the grant: its records give the /28
	// back to the rogue. The agent gets them as its view.
	honest.svc.Sync(restoreView(atSnapshot, "honest"))
	honest.svc.mu.Lock()
	owner, _ := honest.svc.overlays["carve"].Alloc[0].Ring().Owner(inGrant)
	honest.svc.mu.Unlock()
	t.Logf("after the restore the honest agent's ring gives %s to %q", inGrant, owner)
	if held := heldOverlapping(honest.svc, granted); len(held) > 0 {
		l.st = atSnapshot
		pr := membership.NewPeerRecord(l.record("honest"))
		t.Errorf("after the restore the honest agent still hands out %v, which the restored records give the rogue (they give it %v)",
			held, pr.LeasePrefixes())
	}
	for i := 0; ; i++ {
		a, err := honest.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("after-%d", i), IfName: "eth0", Bridge: api.BridgeMesos})
		if err != nil {
			break // the bridge is full
		}
		if p, _ := v4(t, a); granted.Contains(p.Addr()) {
			t.Fatalf("after the restore an ADD got %s, inside %s, which the restored records give the rogue", p, granted)
		}
		if i > 256 {
			t.Fatal("the bridge never fills")
		}
	}
	got, err := honest.svc.Lookup(api.IPAMRequest{Network: "carve", ContainerID: inGrantCID, IfName: "eth0"})
	if err != nil || !containsAddr(got, inGrant) {
		t.Errorf("the container in the block taken back: %+v, %v; want it to keep %s", got, err, inGrant)
	}
	if n, _ := gaugeIn(t, honest.reg, "carve_agent_ipam_isolated_addresses", map[string]string{"overlay": "carve"}); n < 1 {
		t.Errorf("carve_agent_ipam_isolated_addresses = %v, want the container in %s counted", n, granted)
	}

	// The sequel: the records give the agent the /28 once more (here the
	// running cluster's, which kept it; after a whole-cluster restore, the
	// rogue reporting it again with a new statement). The agent adopts it
	// again, and hands out every address there but the one its container
	// still holds.
	l.sync()
	if held := heldOverlapping(honest.svc, granted); len(held) != 1 {
		t.Fatalf("after the masters recorded %s for it again the honest agent holds %v", granted, held)
	}
	for i := 0; ; i++ {
		a, err := honest.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("again-%d", i), IfName: "eth0", Bridge: api.BridgeMesos})
		if err != nil {
			break
		}
		if p, _ := v4(t, a); p.Addr() == inGrant {
			t.Fatalf("%s handed out again while container %s holds it", inGrant, inGrantCID)
		}
		if i > 256 {
			t.Fatal("the bridge never fills")
		}
	}
	checkAllocations(t, honest.svc)
}

// allocIn fills nd's bridge (containers before-0, before-1, ...) until an
// address of block is handed out, and returns it and its container.
func allocIn(t *testing.T, nd *node, block netip.Prefix) (netip.Addr, string) {
	t.Helper()
	for i := 0; ; i++ {
		cid := fmt.Sprintf("before-%d", i)
		if p, _ := v4(t, nd.alloc(t, cid)); block.Contains(p.Addr()) {
			return p.Addr(), cid
		}
	}
}

// containsAddr tells whether an allocation holds addr.
func containsAddr(a *api.Allocation, addr netip.Addr) bool {
	for _, ip := range a.IPs {
		if p, err := netip.ParsePrefix(ip.Address); err == nil && p.Addr() == addr {
			return true
		}
	}
	return false
}

// TestRestoreKeepsABlockGrownAfterTheSnapshot: the honest agent grows a
// block at the masters after a snapshot and a container gets an address
// there; the operator restores that snapshot into the running cluster
// (a real master). The restore leaves the agent the block (the snapshot
// leases that space to nobody), so the agent goes on handing out there,
// isolates nothing, and the masters lease the block to no other agent:
// taken back, it would be free while the container holds its address.
func TestRestoreKeepsABlockGrownAfterTheSnapshot(t *testing.T) {
	l := newRestoreLab(t)
	honest := l.c.nodes["honest"]
	snapshot, err := l.client.Snapshot(l.ctx)
	if err != nil {
		t.Fatal(err)
	}
	grown := func() netip.Prefix {
		rec, err := l.client.Grow(l.ctx, "honest", api.GrowRequest{Overlay: "carve", Bridge: api.BridgeMesos, Family: "4"})
		if err != nil {
			t.Fatalf("grow: %v", err)
		}
		for _, b := range rec.Overlays[0].Blocks {
			if b.Origin == api.BlockGrown {
				return netip.MustParsePrefix(b.Prefix)
			}
		}
		t.Fatalf("the grown record lists no grown block: %+v", rec.Overlays[0].Blocks)
		return netip.Prefix{}
	}()
	l.sync()
	inGrown, inGrownCID := allocIn(t, honest, grown)

	if _, err := l.client.RestoreSnapshot(l.ctx, snapshot); err != nil {
		t.Fatal(err)
	}
	l.sync()
	if held := heldOverlapping(honest.svc, grown); len(held) != 1 || held[0] != grown.String() {
		t.Fatalf("after the restore the honest agent hands out from %v, want %s (the restored records keep it its grow)", held, grown)
	}
	got, err := honest.svc.Lookup(api.IPAMRequest{Network: "carve", ContainerID: inGrownCID, IfName: "eth0"})
	if err != nil || !containsAddr(got, inGrown) {
		t.Errorf("the container in the grown block: %+v, %v; want it to keep %s", got, err, inGrown)
	}
	if n, _ := gaugeIn(t, honest.reg, "carve_agent_ipam_isolated_addresses", map[string]string{"overlay": "carve"}); n != 0 {
		t.Errorf("carve_agent_ipam_isolated_addresses = %v, want 0: the restore took nothing back", n)
	}
	var more bool
	for i := 0; !more; i++ {
		a, err := honest.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("after-%d", i), IfName: "eth0", Bridge: api.BridgeMesos})
		if err != nil {
			t.Fatalf("after the restore the bridge filled before handing out another address of %s: %v", grown, err)
		}
		p, _ := v4(t, a)
		more = grown.Contains(p.Addr())
	}
	// No other agent is leased it: neither the rogue growing nor an agent
	// registering after the restore.
	if rec, err := l.client.Grow(l.ctx, "rogue", api.GrowRequest{Overlay: "carve", Bridge: api.BridgeMesos, Family: "4"}); err == nil {
		for _, b := range rec.Overlays[0].Blocks {
			if netip.MustParsePrefix(b.Prefix).Overlaps(grown) {
				t.Errorf("after the restore the rogue was leased %s, inside the honest agent's %s", b.Prefix, grown)
			}
		}
	}
	if rec, err := l.client.Register(l.ctx, api.RegisterRequest{AgentID: "late", IP: "198.18.9.3", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}); err == nil {
		if s := rec.Overlays[0].Subnet; s != "" && netip.MustParsePrefix(s).Overlaps(grown) {
			t.Errorf("an agent registered after the restore was leased %s, inside the honest agent's %s", s, grown)
		}
	}
	checkAllocations(t, honest.svc)
}
