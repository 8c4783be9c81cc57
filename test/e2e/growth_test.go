package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// The overlays of TestGrowth. "carve" is roomy (a /22 of /27 slices: every
// agent's mesos bridge starts with a /28, 13 container addresses, and the
// masters have 28 free slices to grow from); "full" has exactly one /27
// slice per host, so that the masters have no block left to grow from and a
// host that fills up must be granted space by a peer through the ring. Its
// grow_prefix is /30, the smallest block, so that an agent that grows at
// the masters until they are exhausted takes every free address.
const (
	roomy = "carve"
	full  = "full"
)

// TestGrowth is issue 9's end-to-end scenario ("Growth"), on four hosts
// (masters on hosts 1-3), CNI ADDs through the reference bridge plugin.
// Host 4 (r, no master) is the one that grows.
//
//  1. lease path: 30 ADDs on r on "carve" all succeed; the containers past
//     its first block get addresses of blocks grown from the masters
//     (origin "grow" in the masters' state and in r's IPAM), every other
//     host routes each grown block via r's VTEP (protocol 202, read back
//     through netlink), and the containers ping containers on the other
//     hosts both ways.
//  2. ring path: "full" is fully leased; r fills its first block and is
//     granted a block by a peer through the ring; every other host routes
//     the granted prefix via r's VTEP; pings work; the masters' state shows
//     the block as r's, origin "grant", with its donor.
//  3. the same with every master killed (SIGKILL, by PID): another grant
//     through the ring, routed everywhere, pings; when the masters return
//     their state shows that grant too.
//  4. the donor of the first grant is deleted at the masters (its agent
//     stopped first): r keeps its block (masters and IPAM); once the
//     donor's quarantined space is released (usage reports of the live
//     agents), an agent registered afterwards grows at the masters until
//     they are exhausted and gets none of r's space, but does get the
//     released space around it.
//  5. r restarts from its data dir, then again with its data dir lost: its
//     blocks and every container's address come back (the CNI cache), the
//     containers still ping, new ADDs get fresh addresses, and the real
//     `carve ipam check` reports the cluster clean.
func TestGrowth(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	netCfg := netconfig.Default()
	netCfg.Overlays = []api.OverlayNetwork{
		{Name: roomy, Subnet: "10.128.0.0/22", Prefix: 27},
		{Name: full, Subnet: "10.129.0.0/25", Prefix: 27, GrowPrefix: 30},
	}
	// A full resync every 5 s (not 30): an agent that learned the donor's
	// deletion by gossip before its masters' read passes the new state
	// index to its IPAM, and so to its usage report, only at a resync, and
	// the donor's quarantine is released when every agent has reported
	// past the deletion.
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 4, Masters: 3, Prefix: prefix, Network: &netCfg,
		AgentArgs: []string{"--resync-interval=5s"}})
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	r := c.Host(4)
	// peersOf are a container per other host on each overlay, the other
	// ends of the pings.
	peersOf := map[string][]*labcluster.Container{}
	// grants are r's granted blocks on "full", in the order they came, and
	// grantCts a container in each.
	var grants []api.IPAMBlockUsage
	var grantCts []*labcluster.Container

	step("start", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for _, ov := range []string{roomy, full} {
			for _, h := range others(c, r) {
				ct, err := c.AddCNIContainer(ctx, h, ov, labcluster.CNIOptions{})
				if err != nil {
					t.Fatal(err)
				}
				peersOf[ov] = append(peersOf[ov], ct)
			}
		}
	})

	// The lease path is independent of what follows (another overlay): its
	// failure does not stop the ring path's steps.
	t.Run("lease path: ADDs past the first block grow from the masters", func(t *testing.T) {
		ctx := within(t, 2*converge)
		first := mesosBridge(ctx, t, c, r, roomy)
		cs := addConcurrently(ctx, t, c, r, roomy, 30, 4)
		st := ipamStatus(ctx, t, c, r, roomy)
		var grown []*labcluster.Container
		seen := map[netip.Prefix]bool{}
		for _, ct := range cs {
			b := blockOf(st, ct.Addr.Addr())
			switch {
			case b == nil:
				t.Errorf("%s: no block of %s's IPAM holds it: %+v", ct, r.Name, st.Blocks)
				continue
			case first.Masked().Contains(ct.Addr.Addr()):
				if b.Origin != api.BlockLeased {
					t.Errorf("%s is in the first block %s, listed with origin %q", ct, first.Masked(), b.Origin)
				}
				continue
			case b.Origin != api.BlockGrown:
				t.Errorf("%s: block %s has origin %q, want %q", ct, b.Prefix, b.Origin, api.BlockGrown)
			}
			p := netip.MustParsePrefix(b.Prefix)
			if ct.Gateway != p.Addr().Next() {
				t.Errorf("%s: gateway %s, want the first host of its block %s", ct, ct.Gateway, p)
			}
			if !seen[p] {
				seen[p] = true
				grown = append(grown, ct)
			}
		}
		if len(seen) < 2 {
			t.Fatalf("30 ADDs on a bridge with a /28 first block came from %d grown blocks, want at least 2: %+v", len(seen), st.Blocks)
		}
		// The masters committed every grown block to r.
		want := map[netip.Prefix]bool{}
		for p := range seen {
			want[p] = true
		}
		waitMasterBlocks(ctx, t, c, r, roomy, func(bs []api.Block) error {
			for p := range want {
				if b := findBlock(bs, p); b == nil || b.Origin != api.BlockGrown {
					return fmt.Errorf("block %s: %+v, want origin %q", p, b, api.BlockGrown)
				}
			}
			return nil
		})
		for p := range seen {
			waitRoutedEverywhere(ctx, t, c, r, p)
		}
		kernelAddrs(t, cs)
		pingAll(ctx, t, append(slices.Clone(peersOf[roomy]), grown...))
	})

	// The ring steps go on after a failure that leaves their state usable
	// (a failed ping), so that each scenario reports on its own.
	t.Run("ring path: a full overlay grants through the ring", func(t *testing.T) {
		ctx := within(t, 2*converge)
		ct, b := fillUntilGrant(ctx, t, c, r, nil)
		t.Logf("%s got %s in %s, granted by %s", r.Name, ct.Addr, b.Prefix, b.Donor)
		grants, grantCts = append(grants, b), append(grantCts, ct)
		p := netip.MustParsePrefix(b.Prefix)
		waitRoutedEverywhere(ctx, t, c, r, p)
		pingNoStop(ctx, t, append(slices.Clone(peersOf[full]), ct))
		waitMasterGrant(ctx, t, c, r, b)
	})

	t.Run("ring path with every master down", func(t *testing.T) {
		ctx := within(t, 3*converge)
		for _, m := range c.Masters() {
			if err := c.KillMaster(m); err != nil {
				t.Fatal(err)
			}
		}
		var known []netip.Prefix
		for _, b := range grants {
			known = append(known, netip.MustParsePrefix(b.Prefix))
		}
		ct, b := fillUntilGrant(ctx, t, c, r, known)
		t.Logf("masters down: %s got %s in %s, granted by %s", r.Name, ct.Addr, b.Prefix, b.Donor)
		grants, grantCts = append(grants, b), append(grantCts, ct)
		waitRoutedEverywhere(ctx, t, c, r, netip.MustParsePrefix(b.Prefix))
		pingNoStop(ctx, t, append(slices.Clone(peersOf[full]), grantCts...))

		if err := c.StartMasters(ctx); err != nil {
			t.Fatal(err)
		}
		for _, g := range grants {
			waitMasterGrant(ctx, t, c, r, g)
		}
	})

	t.Run("the donor is deleted: the recipient keeps its block, nobody else gets it", func(t *testing.T) {
		ctx := within(t, 3*converge)
		if len(grants) == 0 {
			t.Fatal("no grant to delete the donor of")
		}
		g := grants[0]
		var donor *labcluster.Host
		for _, h := range others(c, r) {
			if h.AgentID() == g.Donor {
				donor = h
			}
		}
		if donor == nil {
			t.Fatalf("donor %q of %s is none of the hosts", g.Donor, g.Prefix)
		}
		// A host going away: its containers first, then its agent (so that
		// it does not register again), then the operator deletes it.
		for _, ct := range c.Containers() {
			if ct.Host == donor {
				if err := c.DelCNIContainer(ctx, ct); err != nil {
					t.Fatal(err)
				}
			}
		}
		for ov, cs := range peersOf {
			peersOf[ov] = slices.DeleteFunc(cs, func(ct *labcluster.Container) bool { return ct.Host == donor })
		}
		if err := c.StopAgent(ctx, donor); err != nil {
			t.Fatal(err)
		}
		st, err := c.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		donorSpace := agentBlocks(st, g.Donor, full)
		if err := c.Client().DeleteAgent(ctx, g.Donor); err != nil {
			t.Fatal(err)
		}
		t.Logf("deleted %s (%s), which held %v on %s", donor.Name, g.Donor, donorSpace, full)

		// The recipient keeps every granted block, at the masters and in
		// its IPAM, and the containers in them still ping.
		for _, gb := range grants {
			waitMasterGrant(ctx, t, c, r, gb)
			if b := findUsage(ipamStatus(ctx, t, c, r, full), netip.MustParsePrefix(gb.Prefix)); b == nil || b.Origin != api.BlockGranted {
				t.Errorf("after the donor's deletion %s's IPAM lists %s as %+v", r.Name, gb.Prefix, b)
			}
		}
		pingNoStop(ctx, t, append(slices.Clone(peersOf[full]), grantCts...))

		// The donor's space is quarantined until every live agent has sent
		// a complete usage report; then it is free again.
		err = retry.Until(ctx, 200*time.Millisecond, func() error {
			st, err := c.State(ctx)
			if err != nil {
				return err
			}
			for _, q := range st.Quarantine {
				if q.From == g.Donor {
					return fmt.Errorf("%s of %s still quarantined (since %d)", q.Prefix, q.From, q.Since)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("the deleted donor's space is never released: %v", err)
		}

		// An agent registered now, growing at the masters until they have
		// nothing left, gets the released space and none of r's.
		const late = "late-grower"
		register(ctx, t, c, api.RegisterRequest{AgentID: late, IP: "198.18.2.60", MeshAddr: "198.18.2.60:6783"})
		for i := 0; ; i++ {
			_, err := c.Client().Grow(ctx, late, api.GrowRequest{Overlay: full, Bridge: api.BridgeMesos, Family: "4", RequestID: fmt.Sprintf("late-%d", i)})
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeExhausted {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if i > 64 {
				t.Fatalf("%s still grows after %d blocks: the overlay has at most 32 /30s", late, i)
			}
		}
		st, err = c.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lateBlocks := agentBlocks(st, late, full)
		t.Logf("%s grew %v", late, lateBlocks)
		if err := disjointBlocks(st, full); err != nil {
			t.Error(err)
		}
		mine := agentBlocks(st, r.AgentID(), full)
		inDonorSpace := 0
		for _, lb := range lateBlocks {
			for _, rb := range mine {
				if lb.Overlaps(rb) {
					t.Errorf("%s was leased %s, which overlaps %s's %s", late, lb, r.Name, rb)
				}
			}
			for _, gb := range grants {
				if lb.Overlaps(netip.MustParsePrefix(gb.Prefix)) {
					t.Errorf("%s was leased %s, which overlaps the granted %s", late, lb, gb.Prefix)
				}
			}
			for _, d := range donorSpace {
				if d.Overlaps(lb) {
					inDonorSpace++
				}
			}
		}
		if inDonorSpace == 0 {
			t.Errorf("%s got none of the deleted donor's released space %v", late, donorSpace)
		}
		// It runs nowhere: gone again before the checks that ask every agent.
		if err := c.Client().DeleteAgent(ctx, late); err != nil {
			t.Fatal(err)
		}
	})

	restarted := func(t *testing.T, ctx context.Context, before map[string][]api.IPAMBlockUsage) {
		t.Helper()
		if _, err := c.WaitAgent(ctx, r); err != nil {
			t.Fatal(err)
		}
		for _, ov := range []string{roomy, full} {
			want := map[types.GCAttachment]netip.Prefix{}
			for _, ct := range c.AttachedOn(r, ov) {
				want[ct.Attachment()] = ct.Addr
			}
			err := retry.Until(ctx, 200*time.Millisecond, func() error {
				if got := allocations(ctx, t, c, r, ov); !mapsEqual(got, want) {
					return errors.New(diff(got, want))
				}
				st, err := c.IPAMClient(r).Status(ctx, ov)
				if err != nil {
					return err
				}
				if got := blockSet(st); !slices.Equal(got, blockSetOf(before[ov])) {
					return fmt.Errorf("blocks %v, before the restart %v", got, blockSetOf(before[ov]))
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s on %s after the restart: %v", r.Name, ov, err)
			}
		}
		kernelAddrs(t, c.AttachedOn(r, full))
		checkAll(ctx, t, c, append(c.AttachedOn(r, roomy), c.AttachedOn(r, full)...))
		for _, gb := range grants {
			waitRoutedEverywhere(ctx, t, c, r, netip.MustParsePrefix(gb.Prefix))
		}
		pingNoStop(ctx, t, append(slices.Clone(peersOf[full]), grantCts...))

		// New ADDs get fresh addresses.
		held := map[netip.Addr]string{}
		for _, ct := range c.Containers() {
			held[ct.Addr.Addr()] = ct.Name
		}
		for _, ct := range addConcurrently(ctx, t, c, r, roomy, 3, 3) {
			if o, dup := held[ct.Addr.Addr()]; dup && o != ct.Name {
				t.Errorf("%s got %s, which %s holds", ct.Name, ct.Addr, o)
			}
		}
		rep, code := ipamCheck(ctx, t, c)
		if !rep.Clean || code != 0 {
			t.Errorf("carve ipam check: exit %d, clean %v, problems %+v", code, rep.Clean, rep.Problems)
		}
	}
	snapshot := func(ctx context.Context, t *testing.T) map[string][]api.IPAMBlockUsage {
		t.Helper()
		out := map[string][]api.IPAMBlockUsage{}
		for _, ov := range []string{roomy, full} {
			out[ov] = ipamStatus(ctx, t, c, r, ov).Blocks[api.BridgeMesos]
		}
		return out
	}

	t.Run("the recipient restarts", func(t *testing.T) {
		ctx := within(t, 3*converge)
		before := snapshot(ctx, t)
		if err := c.StopAgent(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := c.StartAgent(r); err != nil {
			t.Fatal(err)
		}
		restarted(t, ctx, before)
	})

	step("the recipient restarts with its data dir lost", func(t *testing.T) {
		ctx := within(t, 3*converge)
		before := snapshot(ctx, t)
		if err := c.KillAgent(r); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(r.AgentDataDir); err != nil {
			t.Fatal(err)
		}
		if err := c.StartAgent(r); err != nil {
			t.Fatal(err)
		}
		restarted(t, ctx, before)
	})
}
