package e2e

import (
	"errors"
	"net/netip"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// TestCNI is issue 5's CNI end-to-end scenario on real agents: containers
// are attached the way a runtime attaches them, libcni run inside a host
// namespace with the conflist the agent wrote, the reference bridge and
// portmap plugins, and carve-ipam asking the agent over its unix socket.
// The overlay gives every agent a /22, so the mesos bridge has a /23 (509
// container addresses): enough for 200 containers on one host.
//
//  1. A container on each of the 3 hosts gets, through CNI ADD, an address
//     of its own host's mesos sub-subnet (as the agent reports it); CHECK
//     passes; the containers ping each other across hosts through the
//     overlay; DEL releases the address in the agent's IPAM and a second DEL
//     succeeds.
//  2. 200 concurrent ADDs on one host give 200 distinct addresses of that
//     host's range, the ones the agent's IPAM lists, and CHECK passes on each.
//  3. That host's agent is killed with SIGKILL in the middle of a stream of
//     concurrent ADDs and DELs: ADDs during the outage fail with CNI code 11,
//     DELs fail; the agent restarts from its data dir and the runtime
//     retries what failed. No address is then held twice, the agent holds
//     exactly the live attachments plus, at most, those whose ADD failed and
//     that the runtime gave up on, and a CNI GC with the live attachments
//     frees exactly those.
//  4. CNI GC through the agent's conflist frees exactly the attachments that
//     are not live (libcni DELs them), and carve-ipam's GC frees an
//     allocation the runtime never heard of.
//  5. The real `carve ipam check` finds the cluster clean after all that,
//     then reports an injected leak and an injected duplicate (see
//     checkIPAMAfterChurn).
func TestCNI(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	netCfg := netconfig.Default()
	netCfg.Overlays[0].Prefix = 22
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix, Network: &netCfg})
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	const overlay = "carve"
	h := c.Host(1) // the host of steps 2-4

	step("a container per host", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// The lab's runtime is libcni 1.3 with the plugins 1.9.1: the
		// conflist is spec 1.1.0 (GC, step 4, needs it).
		for _, hh := range c.Hosts() {
			requireConflistVersion(ctx, t, hh, overlay, netconf.LatestCNIVersion)
		}
		var cs []*labcluster.Container
		for _, hh := range c.Hosts() {
			ct, err := c.AddCNIContainer(ctx, hh, overlay, labcluster.CNIOptions{})
			if err != nil {
				t.Fatal(err)
			}
			mesos := mesosBridge(ctx, t, c, hh, overlay)
			if err := inBridge(ct.Addr, mesos); err != nil {
				t.Fatalf("%s on %s: %v", ct.Name, hh.Name, err)
			}
			if ct.Gateway != mesos.Masked().Addr().Next() {
				t.Fatalf("%s on %s: gateway %s, want the bridge's %s", ct.Name, hh.Name, ct.Gateway, mesos.Masked().Addr().Next())
			}
			if got := eth0Addr(t, ct); got != ct.Addr {
				t.Fatalf("%s: eth0 has %v, the ADD result says %s", ct.Name, got, ct.Addr)
			}
			cs = append(cs, ct)
		}
		for _, ct := range cs {
			if err := c.CheckCNIContainer(ctx, ct); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			want := map[types.GCAttachment]netip.Prefix{ct.Attachment(): ct.Addr}
			if got := allocations(ctx, t, c, ct.Host, overlay); !mapsEqual(got, want) {
				t.Errorf("%s's IPAM holds %v, want %v", ct.Host.Name, got, want)
			}
		}
		pingAll(ctx, t, cs)

		for _, ct := range cs {
			if err := c.DelCNIContainer(ctx, ct); err != nil {
				t.Fatal(err)
			}
			if got := allocations(ctx, t, c, ct.Host, overlay); len(got) != 0 {
				t.Errorf("after DEL of %s, %s's IPAM holds %v", ct.Name, ct.Host.Name, got)
			}
			_, err := c.IPAMClient(ct.Host).Lookup(ctx, api.IPAMRequest{Network: overlay, ContainerID: ct.ContainerID, IfName: ct.IfName})
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
				t.Errorf("lookup of %s after DEL = %v, want not_found", ct.Name, err)
			}
			if got := eth0Addr(t, ct); got.IsValid() {
				t.Errorf("%s still has eth0 %s after DEL", ct.Name, got)
			}
			if err := c.DelCNIContainer(ctx, ct); err != nil {
				t.Errorf("second DEL of %s: %v", ct.Name, err)
			}
		}
		if n := len(c.Containers()); n != 0 {
			t.Fatalf("%d containers still attached", n)
		}
	})

	step("200 concurrent ADDs on one host", func(t *testing.T) {
		const n = 200
		ctx := within(t, converge)
		mesos := mesosBridge(ctx, t, c, h, overlay)
		cs := make([]*labcluster.Container, n)
		for i := range cs {
			ct, err := c.NewContainer(h, overlay, labcluster.CNIOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cs[i] = ct
		}
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, ct := range cs {
			wg.Go(func() {
				<-start
				errs[i] = c.CNIAdd(ctx, ct)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("concurrent ADDs: %v", err)
		}
		seen := map[netip.Addr]*labcluster.Container{}
		want := map[types.GCAttachment]netip.Prefix{}
		for _, ct := range cs {
			if o := seen[ct.Addr.Addr()]; o != nil {
				t.Errorf("%s and %s both got %s", o.Name, ct.Name, ct.Addr)
			}
			seen[ct.Addr.Addr()] = ct
			if err := inBridge(ct.Addr, mesos); err != nil {
				t.Errorf("%s: %v", ct.Name, err)
			}
			want[ct.Attachment()] = ct.Addr
		}
		if got := allocations(ctx, t, c, h, overlay); !mapsEqual(got, want) {
			t.Fatalf("the IPAM lists %d allocations, the 200 ADDs got %d distinct addresses: %s", len(got), len(seen), diff(got, want))
		}
		kernelAddrs(t, cs)
		checkAll(ctx, t, c, cs)
	})

	// live are the attachments of h that are live after step 3.
	var live []*labcluster.Container
	step("agent killed during concurrent ADDs and DELs", func(t *testing.T) {
		ctx := within(t, 2*converge)
		s := &stream{c: c, h: h, overlay: overlay}
		live = s.run(ctx, t)
		if t.Failed() {
			t.FailNow()
		}

		// No address is held twice, in the results or in the kernel.
		all := c.Containers()
		if len(all) != len(live) {
			t.Errorf("the harness lists %d attached containers, the runtime model %d", len(all), len(live))
		}
		kernelAddrs(t, all)

		want := map[types.GCAttachment]netip.Prefix{}
		for _, ct := range live {
			want[ct.Attachment()] = ct.Addr
		}
		abandoned := map[types.GCAttachment]bool{}
		for _, ct := range s.abandoned {
			abandoned[ct.Attachment()] = true
		}
		got := allocations(ctx, t, c, h, overlay)
		var orphans []types.GCAttachment
		for at, addr := range got {
			switch w, ok := want[at]; {
			case ok && w != addr:
				t.Errorf("%s/%s: the agent holds %s, the container has %s", at.ContainerID, at.IfName, addr, w)
			case !ok && abandoned[at]:
				orphans = append(orphans, at)
			case !ok:
				t.Errorf("the agent holds %s for %s/%s, which is neither live nor an ADD the runtime gave up on", addr, at.ContainerID, at.IfName)
			}
		}
		for at, addr := range want {
			if _, ok := got[at]; !ok {
				t.Errorf("live %s/%s (%s) has no allocation at the agent", at.ContainerID, at.IfName, addr)
			}
		}
		t.Logf("%d live attachments; %d ADDs failed and were given up on, %d of which left an allocation (answer lost in the crash): %v",
			len(live), len(s.abandoned), len(orphans), orphans)

		// CNI GC with the live attachments (carve-ipam's own: the bridge
		// plugin does not pass GC on, see step 4) frees exactly those.
		if err := c.GCIPAM(ctx, h, overlay, attachments(live)); err != nil {
			t.Fatal(err)
		}
		if got := allocations(ctx, t, c, h, overlay); !mapsEqual(got, want) {
			t.Fatalf("after GC with the live attachments: %s", diff(got, want))
		}
		checkAll(ctx, t, c, live)
	})

	var valid []*labcluster.Container // live after step 4
	step("GC frees what is not live", func(t *testing.T) {
		ctx := within(t, converge)
		// The runtime forgets every third container; an allocation it never
		// heard of (an ADD whose answer was lost) is added behind its back.
		var gone []*labcluster.Container
		for i, ct := range live {
			if i%3 == 0 {
				gone = append(gone, ct)
			} else {
				valid = append(valid, ct)
			}
		}
		lost := api.IPAMRequest{Network: overlay, ContainerID: "answer-lost", IfName: "eth0"}
		if _, err := c.IPAMClient(h).Allocate(ctx, lost); err != nil {
			t.Fatal(err)
		}
		want := map[types.GCAttachment]netip.Prefix{}
		for _, ct := range valid {
			want[ct.Attachment()] = ct.Addr
		}

		// Through the agent's conflist: libcni DELs the cached attachments
		// that are not valid (bridge and carve-ipam DEL: veth and address
		// gone), then sends GC down the list; the bridge plugin (v1.9.1)
		// does not pass it on to carve-ipam, so the allocation libcni never
		// cached survives.
		if err := c.GCNetwork(ctx, h, overlay, attachments(valid)); err != nil {
			t.Fatal(err)
		}
		got := allocations(ctx, t, c, h, overlay)
		lostAt := types.GCAttachment{ContainerID: lost.ContainerID, IfName: lost.IfName}
		if _, ok := got[lostAt]; !ok {
			t.Errorf("GC through the bridge plugin freed the uncached allocation: the bridge plugin passes GC on now; update this test")
		}
		delete(got, lostAt)
		if !mapsEqual(got, want) {
			t.Fatalf("after GC through the conflist: %s", diff(got, want))
		}
		for _, ct := range gone {
			if a := eth0Addr(t, ct); a.IsValid() {
				t.Errorf("%s was not valid but keeps eth0 %s", ct.Name, a)
			}
		}
		if n := len(c.AttachedOn(h, overlay)); n != len(valid) {
			t.Errorf("the harness lists %d attached containers, want %d", n, len(valid))
		}

		// carve-ipam's own GC frees exactly the one nobody knows of.
		if err := c.GCIPAM(ctx, h, overlay, attachments(valid)); err != nil {
			t.Fatal(err)
		}
		if got := allocations(ctx, t, c, h, overlay); !mapsEqual(got, want) {
			t.Fatalf("after carve-ipam's GC: %s", diff(got, want))
		}
		kernelAddrs(t, valid)
	})

	step("carve ipam check", func(t *testing.T) {
		checkIPAMAfterChurn(within(t, 2*converge), t, c, overlay, valid)
	})
}
