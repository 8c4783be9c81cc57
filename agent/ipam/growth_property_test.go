package ipam

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/testutil"
)

// recordingMasters is a TEST DOUBLE for the masters' lease table, enough
// of it for growth: each agent's record is its lease set (its /26 and /64
// at first), a grant report cuts the block out of the donor's set and adds
// it to the recipient's as a granted block, a return gives a granted block
// back to its donor, and Grow has no block left (growth goes through the
// ring). Each agent reaches it through its own client (as), which names
// the agent, as the real masters' client does: a return gives back only
// what its sender holds. Reports are idempotent, as the real masters' are
// (master/state): a resent one changes nothing, whatever happened since.
// Its request id names one taken already (its outcome stands); else a
// return of what the sender no longer holds, a grant whose block went back
// since, is refused for good.
type recordingMasters struct {
	mu      sync.Mutex
	index   uint64
	records map[string]*masterRecord
	// requests are the request ids of the reports taken; moved the grant
	// statements that moved a block once.
	requests, moved map[string]bool
	// took are the reports taken, by sender, to send again (resend).
	took []sentReport
}

// sentReport is a report the masters took: a grant, or a return (ret
// set).
type sentReport struct {
	from  string
	grant GrantReport
	ret   netip.Prefix
	rid   string // the return's request id
}

// masterRecord is one agent's record: its lease set and the blocks beyond
// its bridges' first sub-subnets.
type masterRecord struct {
	version uint64
	leases  []netip.Prefix
	blocks  []MasterBlock
}

func newRecordingMasters(ids []string) *recordingMasters {
	m := &recordingMasters{index: 100, records: map[string]*masterRecord{}, requests: map[string]bool{}, moved: map[string]bool{}}
	for _, id := range ids {
		self := growthSelf(id)
		ov := self.Overlays[0]
		m.records[id] = &masterRecord{version: self.Version, leases: []netip.Prefix{netip.MustParsePrefix(ov.Subnet), netip.MustParsePrefix(ov.Subnet6)}}
	}
	return m
}

// cut takes p out of a record (its leases and blocks).
func (r *masterRecord) cut(p netip.Prefix) {
	var leases []netip.Prefix
	for _, l := range r.leases {
		leases = append(leases, blockaddr.Uncovered(l, []netip.Prefix{p})...)
	}
	r.leases = leases
	r.blocks = slices.DeleteFunc(r.blocks, func(b MasterBlock) bool { return b.Prefix.Overlaps(p) })
}

// covers tells whether the record's lease set covers all of p.
func (r *masterRecord) covers(p netip.Prefix) bool {
	return len(blockaddr.Uncovered(p, r.leases)) == 0
}

// as is agent id's client of the masters (its BlockSource).
func (m *recordingMasters) as(id string) BlockSource { return agentMasters{m: m, id: id} }

// agentMasters is the masters as one agent's client reaches them.
type agentMasters struct {
	m  *recordingMasters
	id string
}

func (a agentMasters) Grow(context.Context, string, string, int, string) (LeasedBlock, error) {
	return LeasedBlock{}, ErrMastersExhausted
}

func (a agentMasters) Return(_ context.Context, r ReturnReport) error {
	return a.m.giveBack(a.id, r.Prefix, r.RequestID)
}

func (a agentMasters) ReportGrant(_ context.Context, g GrantReport) error {
	return a.m.reportGrant(a.id, g)
}

// giveBack frees what agent id holds of p, a granted block (or part of
// one): its donor takes it back, as part of its lease set again (the real
// masters merge it into the donor's block it came from). A return of what
// id does not hold (sent again after the masters took it) is refused for
// good, as the real masters' ErrBlockConflict is.
func (m *recordingMasters) giveBack(id string, p netip.Prefix, requestID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.requests[requestID] {
		return nil // taken already
	}
	r := m.records[id]
	if r == nil {
		return fmt.Errorf("%w: unknown agent %q", ErrReportRefused, id)
	}
	var give []MasterBlock
	for _, b := range r.blocks {
		if b.Prefix.Overlaps(p) {
			if b.Prefix.Bits() < p.Bits() {
				b.Prefix = p // a part of the block
			}
			give = append(give, b)
		}
	}
	if len(give) == 0 {
		return fmt.Errorf("%w: agent %q holds no block inside %s", ErrReportRefused, id, p)
	}
	m.index++
	m.requests[requestID] = true
	m.took = append(m.took, sentReport{from: id, ret: p, rid: requestID})
	r.cut(p)
	r.version = m.index
	for _, b := range give {
		if d := m.records[b.Donor]; d != nil && b.Donor != id {
			d.leases = append(d.leases, b.Prefix)
			d.version = m.index
		}
	}
	return nil
}

// reportGrant records a grant: the donor lets go of the block, the
// recipient holds it as a granted block. A report of a grant the
// recipient holds already changes nothing; one whose statement moved the
// block once already (it went back since) is refused for good, as the
// real masters' ErrStatementUsed is.
func (m *recordingMasters) reportGrant(from string, g GrantReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.requests[g.RequestID] {
		return nil // taken already
	}
	recip, donor := m.records[g.Recipient], m.records[g.Donor]
	if recip == nil || donor == nil || from != g.Recipient {
		return fmt.Errorf("%w: unknown agent, or not the recipient's report", ErrReportRefused)
	}
	if slices.ContainsFunc(recip.leases, func(l netip.Prefix) bool { return l.Bits() <= g.Prefix.Bits() && l.Contains(g.Prefix.Addr()) }) {
		return nil // already the recipient's
	}
	statement := fmt.Sprint(g.Donor, "/", g.Recipient, "/", g.Prefix, "/", g.RequestID, "/", g.DonorSignature)
	if m.moved[statement] {
		return fmt.Errorf("%w: the grant of %s to %s moved it once already", ErrReportRefused, g.Prefix, g.Recipient)
	}
	m.moved[statement] = true
	m.requests[g.RequestID] = true
	m.index++
	m.took = append(m.took, sentReport{from: from, grant: g})
	donor.cut(g.Prefix)
	donor.version = m.index
	recip.cut(g.Prefix)
	recip.leases = append(recip.leases, g.Prefix)
	bridge := g.Bridge
	if bridge == "" {
		bridge = api.BridgeMesos
	}
	recip.blocks = append(recip.blocks, MasterBlock{Overlay: g.Overlay, Bridge: bridge, Prefix: g.Prefix, Version: m.index, Donor: g.Donor})
	recip.version = m.index
	return nil
}

// taken is the reports the masters took, in order.
func (m *recordingMasters) taken() []sentReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.took)
}

// resend sends a report the masters took again, from its sender, as an
// agent does whose answer was lost (it crashed before it deleted the
// report from its outbox).
func (m *recordingMasters) resend(r sentReport) {
	src := m.as(r.from)
	if r.ret.IsValid() {
		_ = src.Return(context.Background(), ReturnReport{Overlay: "carve", Prefix: r.ret, RequestID: r.rid})
		return
	}
	_ = src.ReportGrant(context.Background(), r.grant)
}

// String says what the report was.
func (r sentReport) String() string {
	if r.ret.IsValid() {
		return fmt.Sprintf("%s's return of %s", r.from, r.ret)
	}
	return fmt.Sprintf("%s's report of %s's grant of %s", r.from, r.grant.Donor, r.grant.Prefix)
}

// recordCovers tells whether agent id's record at the masters leases all
// of p.
func (m *recordingMasters) recordCovers(id string, p netip.Prefix) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.records[id].covers(p)
}

// view is an agent's view of the masters' records.
func (m *recordingMasters) view(id string) View {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := View{ClusterID: "c1", Self: growthSelf(id), Network: &api.NetworkConfig{OverlayMTU: 1400}}
	v.Self.Version = m.records[id].version
	for _, pid := range slices.Sorted(maps.Keys(m.records)) {
		r := m.records[pid]
		p := Peer{ID: pid, Version: r.version, ClaimKey: claimKeyOf(pid).Public().(ed25519.PublicKey)}
		for _, l := range r.leases {
			p.Subnets = append(p.Subnets, l.String())
		}
		v.Peers = append(v.Peers, p)
	}
	v.Blocks = slices.Clone(m.records[id].blocks)
	return v
}

// propertyCluster is a cluster whose views come from recordingMasters.
type propertyCluster struct {
	*cluster
	masters *recordingMasters
	ids     []string
}

func newPropertyCluster(t *testing.T, seed uint64, ids []string) *propertyCluster {
	t.Helper()
	c := newCluster(t, seed, GrowthConfig{IdleReturn: time.Hour, LowWater: -1, Wait: 5 * time.Second})
	pc := &propertyCluster{cluster: c, masters: newRecordingMasters(ids), ids: ids}
	c.source = pc.masters.as
	for _, id := range ids {
		c.start(id, t.TempDir(), "")
		c.nodes[id].svc.Sync(pc.masters.view(id))
	}
	pc.gossipRounds()
	return pc
}

// report has every agent send its outbox to the masters and syncs every
// agent with its new view, then lets the rings converge. The agent's own
// loop sends (Run): its reporter has one sender, and a second one would
// send a report twice (masterreport.Reporter).
func (pc *propertyCluster) report() {
	pc.t.Helper()
	for _, id := range pc.ids {
		svc := pc.nodes[id].svc
		svc.reports.Kick()
		testutil.Eventually(pc.t, 0, id+"'s outbox sent", func() error {
			entries, err := ipamstore.ReadOutbox(svc.db)
			if err == nil && len(entries) > 0 {
				err = fmt.Errorf("%d reports not sent yet", len(entries))
			}
			return err
		})
	}
	for _, id := range pc.ids {
		pc.nodes[id].svc.Sync(pc.masters.view(id))
	}
	pc.gossipRounds()
}

// returnIdle has an agent give back every block that is idle now.
func (pc *propertyCluster) returnIdle(id string) {
	svc := pc.nodes[id].svc
	now := time.Now()
	svc.returnIdle(now)
	svc.returnIdle(now.Add(2 * svc.grow.cfg.IdleReturn))
}

// checkBridgeAddresses fails when a handed-out address is a network,
// broadcast or gateway address of a prefix of its bridge, as BridgeBlocks
// has the agent program them, or when two prefixes of an agent's bridges
// overlap; and (checkNoDoubles) when two containers hold one address.
func (pc *propertyCluster) checkBridgeAddresses(what string) {
	pc.t.Helper()
	for _, id := range pc.ids {
		svc := pc.nodes[id].svc
		svc.mu.Lock()
		var errs []string
		for _, o := range svc.overlays {
			for fam := range families {
				var all []netip.Prefix
				for _, kind := range sortedKeys(o.Bridges) {
					all = append(all, o.BridgeBlocks(kind, fam)...)
				}
				for i, p := range all {
					for _, q := range all[i+1:] {
						if p.Overlaps(q) {
							errs = append(errs, fmt.Sprintf("bridge prefixes %s and %s overlap", p, q))
						}
					}
				}
			}
			for at, rec := range o.Attached {
				for fam := range families {
					addr := rec.Addr(fam)
					if !addr.IsValid() {
						continue
					}
					if p, ok := blockaddr.BridgeAddressOf(o.BridgeBlocks(rec.Bridge, fam), addr); ok {
						errs = append(errs, fmt.Sprintf("%s/%s holds %s, the network, broadcast or gateway address of the %s bridge's %s", at.ContainerID, at.Interface, addr, rec.Bridge, p))
					}
				}
			}
		}
		svc.mu.Unlock()
		if len(errs) > 0 {
			slices.Sort(errs)
			pc.t.Fatalf("%s: agent %s: %s", what, id, strings.Join(errs, "; "))
		}
	}
	pc.checkNoDoubles()
}

// TestReturnedGrantMergesIntoDonor: a block a donor granted, which the
// masters then cut out of its lease set, comes back to the donor when the
// recipient gives it back idle. It merges back into the donor's bridge
// (no extra prefix on it, so no broadcast address inside the bridge's
// first block), and the donor's containers never get a network, broadcast
// or gateway address of a prefix on their bridge.
func TestReturnedGrantMergesIntoDonor(t *testing.T) {
	pc := newPropertyCluster(t, 11, []string{"a", "b"})
	a, b := pc.nodes["a"], pc.nodes["b"]
	// b's docker bridge is full: what b grants comes out of its mesos one.
	for i := range 29 {
		if _, err := b.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("d", i), IfName: "eth0", Bridge: api.BridgeDocker}); err != nil {
			t.Fatal(err)
		}
	}
	// a fills its mesos bridge (29 addresses) and asks b for more, twice.
	for i := range 40 {
		a.alloc(t, fmt.Sprint("a", i))
	}
	pc.report()
	pc.checkBridgeAddresses("after the grants")
	if n := len(a.svc.Status("carve").Blocks[api.BridgeMesos]); n < 3 {
		t.Fatalf("a holds %d mesos blocks, want two grants", n)
	}
	// a's containers go: the granted blocks go back to b.
	for i := range 40 {
		if _, err := a.svc.Release(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("a", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	pc.returnIdle("a")
	pc.report()
	if bs := a.svc.Status("carve").Blocks[api.BridgeMesos]; len(bs) != 1 {
		t.Fatalf("a still holds %+v", bs)
	}
	if bs := b.svc.Status("carve").Blocks[api.BridgeMesos]; len(bs) != 1 || bs[0].Prefix != "10.128.0.64/27" {
		t.Errorf("b's mesos bridge holds %+v after the return, want its first block alone", bs)
	}
	// b fills its mesos bridge: every address is a host of its /27, none
	// the broadcast address of a returned block inside it.
	for i := range 29 {
		b.alloc(t, fmt.Sprint("b", i))
	}
	pc.checkBridgeAddresses("after b filled its bridge")
}

// TestResentReportsChangeNothing: blocks a donor granted come back to it,
// at the masters too, when the recipient gives them back idle, whichever
// of the two sorts first; and any report sent again afterwards (an agent
// whose answer was lost sends it again, and two senders of one outbox
// send a report twice) changes nothing: the masters take no
// space from the donor, whose containers hold addresses in the blocks that
// came back. Before, the double gave a resent return's block up from
// whoever held it then, the donor: its record lost the block, the sync
// took it out of its ring, and its containers there held addresses the
// ring gave nobody (the flake of TestGrowthPropertyBridgeAddresses).
func TestResentReportsChangeNothing(t *testing.T) {
	for _, tc := range []struct {
		name             string
		recipient, donor string
	}{
		{"the recipient sorts first", "a", "b"},
		{"the donor sorts first", "b", "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newPropertyCluster(t, 11, []string{"a", "b"})
			recip, donor := pc.nodes[tc.recipient], pc.nodes[tc.donor]
			lease := netip.MustParsePrefix(growthSelf(tc.donor).Overlays[0].Subnet)
			// The donor's docker bridge is full: what it grants comes out of
			// its mesos one.
			for i := range 29 {
				if _, err := donor.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("d", i), IfName: "eth0", Bridge: api.BridgeDocker}); err != nil {
					t.Fatal(err)
				}
			}
			// The recipient fills its mesos bridge and gets blocks from the
			// donor; then its containers go, and the blocks go back.
			for i := range 40 {
				recip.alloc(t, fmt.Sprint("r", i))
			}
			pc.report()
			if pc.masters.recordCovers(tc.donor, lease) {
				t.Fatalf("the masters recorded no grant of %s", tc.donor)
			}
			for i := range 40 {
				if _, err := recip.svc.Release(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("r", i), IfName: "eth0"}); err != nil {
					t.Fatal(err)
				}
			}
			pc.returnIdle(tc.recipient)
			pc.report()
			if !pc.masters.recordCovers(tc.donor, lease) {
				t.Errorf("after the return the masters' record of %s does not lease its %s again", tc.donor, lease)
			}
			// The donor fills its mesos bridge: in the blocks that came back.
			for i := range 29 {
				donor.alloc(t, fmt.Sprint("m", i))
			}
			pc.report()
			pc.checkBridgeAddresses("after the donor filled its bridge")
			// Each report sent again, one by one.
			taken := pc.masters.taken()
			if len(taken) == 0 {
				t.Fatal("the masters took no report")
			}
			for _, r := range taken {
				pc.masters.resend(r)
				pc.report()
				if !pc.masters.recordCovers(tc.donor, lease) {
					t.Errorf("after %v was sent again the masters' record of %s does not lease its %s", r, tc.donor, lease)
				}
				pc.checkBridgeAddresses(fmt.Sprintf("after %v was sent again", r))
			}
		})
	}
}

// TestGrowthPropertyBridgeAddresses runs random histories of ADDs, DELs,
// idle returns and reports to the masters on three agents, whose masters
// cut granted blocks out of the donors' lease sets: after every step no
// handed-out address is a network, broadcast or gateway address of a prefix
// on its bridge, no two bridge prefixes of an agent overlap, and no address
// is held twice. The seed is printed on failure.
func TestGrowthPropertyBridgeAddresses(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			ids := []string{"a", "b", "c"}
			pc := newPropertyCluster(t, seed, ids)
			rng := rand.New(rand.NewPCG(seed, 17))
			held := map[string][]string{}
			var history []string
			defer func() {
				if t.Failed() {
					t.Logf("seed %d, history:\n%s", seed, strings.Join(history, "\n"))
				}
			}()
			next := 0
			for step := range 60 {
				id := ids[rng.IntN(len(ids))]
				nd := pc.nodes[id]
				switch op := rng.IntN(10); {
				case op < 4: // a burst of ADDs
					n := 1 + rng.IntN(20)
					bridge := api.BridgeMesos
					if rng.IntN(3) == 0 {
						bridge = api.BridgeDocker
					}
					history = append(history, fmt.Sprintf("%d: %s adds %d on %s", step, id, n, bridge))
					for range n {
						cid := fmt.Sprint("c", next)
						next++
						_, err := nd.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Bridge: bridge})
						if err != nil {
							if !api.IsCode(err, api.CodeExhausted) {
								t.Fatalf("step %d: %s: allocate %s: %v", step, id, cid, err)
							}
							break
						}
						held[id] = append(held[id], cid)
					}
				case op < 7: // a burst of DELs
					n := min(len(held[id]), 1+rng.IntN(30))
					history = append(history, fmt.Sprintf("%d: %s deletes %d", step, id, n))
					for range n {
						i := rng.IntN(len(held[id]))
						cid := held[id][i]
						held[id] = slices.Delete(held[id], i, i+1)
						if _, err := nd.svc.Release(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0"}); err != nil {
							t.Fatalf("step %d: %s: release %s: %v", step, id, cid, err)
						}
					}
				case op < 9:
					history = append(history, fmt.Sprintf("%d: %s gives back its idle blocks", step, id))
					pc.returnIdle(id)
				default:
					history = append(history, fmt.Sprintf("%d: reports to the masters", step))
				}
				pc.report()
				pc.checkBridgeAddresses(fmt.Sprintf("seed %d step %d", seed, step))
			}
		})
	}
}

// TestAllocateHostSkipsBridgeAddresses: whatever a bridge's blocks are,
// nested ones included, no address handed out is a network, broadcast or
// gateway address of any of them, and the ones skipped stay free.
func TestAllocateHostSkipsBridgeAddresses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks []string
		want   int // addresses handed out before ErrFull
	}{
		{"one /28", []string{"10.0.0.0/28"}, 13},
		{"a /30 inside", []string{"10.0.0.0/28", "10.0.0.8/30"}, 10},
		{"two nested", []string{"10.0.0.0/28", "10.0.0.4/30", "10.0.0.8/29"}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alloc, err := ring.NewAllocator("self", netip.MustParsePrefix("10.0.0.0/24"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := alloc.Seed([]ring.Lease{{Owner: "self", Prefix: netip.MustParsePrefix("10.0.0.0/24"), Version: 1}}, nil); err != nil {
				t.Fatal(err)
			}
			var blocks []netip.Prefix
			for _, b := range tc.blocks {
				blocks = append(blocks, netip.MustParsePrefix(b))
			}
			n := 0
			for ; ; n++ {
				addr, err := blockaddr.AllocateHost(alloc, ring.Attachment{ContainerID: fmt.Sprint("c", n), Interface: "eth0"}, blocks)
				if errors.Is(err, ring.ErrFull) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if p, edge := blockaddr.BridgeAddressOf(blocks, addr); edge {
					t.Fatalf("handed out %s, an address of the bridge's %s", addr, p)
				}
			}
			if n != tc.want {
				t.Errorf("%d addresses handed out, want %d", n, tc.want)
			}
			if r := alloc.Reserved(); len(r) != 0 {
				t.Errorf("reserved %v left behind", r)
			}
		})
	}
}
