package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/internal/lab/labcluster"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/state"
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
	netCfg := state.DefaultConfig()
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

// stream is a runtime that attaches and detaches containers on one host
// from several workers at once while the host's agent is killed and started
// again, and then retries what failed.
type stream struct {
	c       *labcluster.Cluster
	h       *labcluster.Host
	overlay string

	// phase is where the agent's life is (phaseUp ... phaseReady); an
	// operation reads it when it starts and when it ends.
	phase atomic.Int32

	mu sync.Mutex
	// live: ADD succeeded and no DEL did.
	live []*labcluster.Container
	// delFailed: live containers whose DEL failed; the runtime retries it.
	delFailed []*labcluster.Container
	// addFailed: containers whose ADD failed; their cleanup DEL may have failed too.
	addFailed []*labcluster.Container
	// abandoned: failed ADDs the runtime gave up on (never DELed again).
	abandoned []*labcluster.Container
	// outage counts the operations that ran entirely while the agent was dead.
	outageAdds, outageDels int
	ok                     int // successful operations
}

// workers run the stream; each alternates ADD, ADD, DEL of its own containers.
const workers = 8

// The phases of the stream. An operation that ended in phaseUp ran with the
// agent up and must succeed; one that started and ended in phaseDead must
// fail; one that started in phaseReady must succeed. Operations that
// overlap the kill or the restart may go either way.
const (
	phaseUp      = iota // the agent runs
	phaseKilling        // SIGKILL is being sent
	phaseDead           // the agent is gone
	phaseStarted        // started again, maybe not serving yet
	phaseReady          // serving again
)

func (s *stream) run(ctx context.Context, t *testing.T) []*labcluster.Container {
	t.Helper()
	s.live = s.c.AttachedOn(s.h, s.overlay) // the 200 of step 2 stay attached through the crash
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { s.worker(ctx, t, w, stop) })
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		err := retry.Until(ctx, 10*time.Millisecond, func() error {
			if t.Failed() {
				return retry.Permanent(errors.New("a worker failed"))
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if !cond() {
				return fmt.Errorf("%d ok, %d ADDs and %d DELs in the outage", s.ok, s.outageAdds, s.outageDels)
			}
			return nil
		})
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}

	waitFor("40 operations", func() bool { return s.ok >= 40 })
	s.phase.Store(phaseKilling)
	if err := s.c.KillAgent(s.h); err != nil { // SIGKILL by PID, waits until it is gone
		t.Fatal(err)
	}
	s.phase.Store(phaseDead)
	waitFor("ADDs and DELs during the outage", func() bool { return s.outageAdds >= 5 && s.outageDels >= 5 })
	s.phase.Store(phaseStarted)
	if err := s.c.StartAgent(s.h); err != nil { // the same data dir
		t.Fatal(err)
	}
	if _, err := s.c.WaitAgent(ctx, s.h); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.IPAMClient(s.h).Status(ctx, s.overlay); err != nil {
		t.Fatal(err)
	}
	s.phase.Store(phaseReady)
	s.mu.Lock()
	okBefore := s.ok
	s.mu.Unlock()
	waitFor("40 operations after the restart", func() bool { return s.ok >= okBefore+40 })
	close(stop)
	wg.Wait()
	s.mu.Lock()
	t.Logf("stream: %d operations succeeded; during the outage %d ADDs and %d DELs failed; %d ADDs and %d DELs to retry",
		s.ok, s.outageAdds, s.outageDels, len(s.addFailed), len(s.delFailed))
	s.mu.Unlock()
	if t.Failed() {
		return nil
	}
	s.retry(ctx, t)
	return s.live
}

func (s *stream) worker(ctx context.Context, t *testing.T, w int, stop <-chan struct{}) {
	var mine []*labcluster.Container
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		start := s.phase.Load()
		if i%3 != 2 || len(mine) == 0 {
			ct, err := s.c.AddCNIContainer(ctx, s.h, s.overlay, labcluster.CNIOptions{})
			end := s.phase.Load()
			if ct == nil {
				t.Errorf("worker %d: %v", w, err)
				return
			}
			if err == nil {
				if start == phaseDead && end == phaseDead {
					t.Errorf("worker %d: ADD %s succeeded while the agent was dead", w, ct.Name)
				}
				mine = append(mine, ct)
				s.mu.Lock()
				s.live = append(s.live, ct)
				s.ok++
				s.mu.Unlock()
				continue
			}
			if code := labcluster.CNICode(err); code != types.ErrTryAgainLater {
				t.Errorf("worker %d: ADD failed with CNI code %d, want %d (try again later): %v", w, code, types.ErrTryAgainLater, err)
			}
			if end == phaseUp || start == phaseReady {
				t.Errorf("worker %d: ADD failed with the agent up: %v", w, err)
			}
			// The bridge plugin leaves the veth of a failed ADD: a runtime
			// cleans up with DEL at once (and retries it later if it fails).
			delStart := s.phase.Load()
			delErr := s.c.DelCNIContainer(ctx, ct)
			delEnd := s.phase.Load()
			if delErr == nil && delStart == phaseDead && delEnd == phaseDead {
				t.Errorf("worker %d: cleanup DEL of %s succeeded while the agent was dead", w, ct.Name)
			}
			s.mu.Lock()
			if start == phaseDead && end == phaseDead {
				s.outageAdds++
			}
			s.addFailed = append(s.addFailed, ct)
			s.mu.Unlock()
			continue
		}
		ct := mine[0]
		mine = mine[1:]
		err := s.c.DelCNIContainer(ctx, ct)
		end := s.phase.Load()
		s.mu.Lock()
		if err == nil {
			if start == phaseDead && end == phaseDead {
				t.Errorf("worker %d: DEL %s succeeded while the agent was dead", w, ct.Name)
			}
			s.live = slices.DeleteFunc(s.live, func(x *labcluster.Container) bool { return x == ct })
			s.ok++
		} else {
			if end == phaseUp || start == phaseReady {
				t.Errorf("worker %d: DEL failed with the agent up: %v", w, err)
			}
			if start == phaseDead && end == phaseDead {
				s.outageDels++
			}
			s.delFailed = append(s.delFailed, ct)
		}
		s.mu.Unlock()
	}
}

// retry does what a runtime does once the agent is back: it retries every
// failed DEL until it succeeds; of the failed ADDs, it cleans up and
// attaches again every other one (the same container id), and gives up on
// the rest (a runtime that lost track of them, or moved on to a new
// sandbox), which only GC can clean up.
func (s *stream) retry(ctx context.Context, t *testing.T) {
	t.Helper()
	del := func(ct *labcluster.Container) {
		t.Helper()
		err := retry.Until(ctx, 100*time.Millisecond, func() error { return s.c.DelCNIContainer(ctx, ct) })
		if err != nil {
			t.Fatalf("retried DEL of %s: %v", ct.Name, err)
		}
	}
	for _, ct := range s.delFailed {
		del(ct)
		s.live = slices.DeleteFunc(s.live, func(x *labcluster.Container) bool { return x == ct })
	}
	for i, ct := range s.addFailed {
		if i%2 == 1 {
			s.abandoned = append(s.abandoned, ct)
			continue
		}
		del(ct)
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			err := s.c.CNIAdd(ctx, ct)
			if err != nil && labcluster.CNICode(err) != types.ErrTryAgainLater {
				return retry.Permanent(err)
			}
			return err
		})
		if err != nil {
			t.Fatalf("retried ADD of %s: %v", ct.Name, err)
		}
		s.live = append(s.live, ct)
	}
}

// mesosBridge is h's mesos sub-subnet on overlay, as its agent reports it.
func mesosBridge(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string) netip.Prefix {
	t.Helper()
	info, err := c.AgentClient(h).Overlay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ov := info.Overlay(overlay)
	if ov == nil || ov.MesosBridge == nil {
		t.Fatalf("agent on %s reports no mesos bridge on %s: %+v", h.Name, overlay, info)
	}
	p, err := netip.ParsePrefix(ov.MesosBridge.IP)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// inBridge checks that addr is a container address of the bridge's
// sub-subnet, with its prefix: not its network, gateway or broadcast address.
func inBridge(addr, bridge netip.Prefix) error {
	sub := bridge.Masked()
	a := addr.Addr()
	switch {
	case addr.Bits() != sub.Bits():
		return fmt.Errorf("address %s has not the bridge's prefix /%d", addr, sub.Bits())
	case !sub.Contains(a):
		return fmt.Errorf("address %s outside the host's mesos sub-subnet %s", addr, sub)
	case a == sub.Addr() || a == sub.Addr().Next() || !sub.Contains(a.Next()):
		return fmt.Errorf("address %s is the network, gateway or broadcast address of %s", addr, sub)
	}
	return nil
}

// allocations is the agent's IPAM list on overlay, read through its socket.
func allocations(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string) map[types.GCAttachment]netip.Prefix {
	t.Helper()
	list, err := c.IPAMClient(h).List(ctx, overlay)
	if err != nil {
		t.Fatalf("IPAM list of %s: %v", h.Name, err)
	}
	out := map[types.GCAttachment]netip.Prefix{}
	for _, a := range list.Allocations {
		if len(a.IPs) != 1 {
			t.Fatalf("allocation %+v: want one address", a)
		}
		at := types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}
		if _, dup := out[at]; dup {
			t.Fatalf("%s/%s listed twice", a.ContainerID, a.IfName)
		}
		out[at] = netip.MustParsePrefix(a.IPs[0].Address)
	}
	return out
}

func mapsEqual(a, b map[types.GCAttachment]netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// diff describes how the agent's allocations (got) differ from want.
func diff(got, want map[types.GCAttachment]netip.Prefix) string {
	var extra, missing, wrong []string
	for k, v := range got {
		if w, ok := want[k]; !ok {
			extra = append(extra, fmt.Sprintf("%s/%s=%s", k.ContainerID, k.IfName, v))
		} else if w != v {
			wrong = append(wrong, fmt.Sprintf("%s/%s=%s (want %s)", k.ContainerID, k.IfName, v, w))
		}
	}
	for k, v := range want {
		if _, ok := got[k]; !ok {
			missing = append(missing, fmt.Sprintf("%s/%s=%s", k.ContainerID, k.IfName, v))
		}
	}
	slices.Sort(extra)
	slices.Sort(missing)
	slices.Sort(wrong)
	return fmt.Sprintf("the agent holds %d, want %d; extra %v; missing %v; different %v", len(got), len(want), extra, missing, wrong)
}

func attachments(cs []*labcluster.Container) []types.GCAttachment {
	out := make([]types.GCAttachment, 0, len(cs))
	for _, ct := range cs {
		out = append(out, ct.Attachment())
	}
	return out
}

// eth0Addr reads the IPv4 address of the container's interface from its
// namespace (invalid when it has none, or no interface).
func eth0Addr(t *testing.T, ct *labcluster.Container) netip.Prefix {
	t.Helper()
	nh, err := ct.NS.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	link, err := nh.LinkByName(ct.IfName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return netip.Prefix{}
		}
		t.Fatalf("%s in %s: %v", ct.IfName, ct.Name, err)
	}
	addrs, err := nh.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 {
		if len(addrs) > 1 {
			t.Errorf("%s in %s has %d addresses: %v", ct.IfName, ct.Name, len(addrs), addrs)
		}
		return netip.Prefix{}
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	ones, _ := addrs[0].Mask.Size()
	return netip.PrefixFrom(a, ones)
}

// kernelAddrs checks that every container's interface holds the address of
// its ADD result, and that no two containers hold the same one.
func kernelAddrs(t *testing.T, cs []*labcluster.Container) {
	t.Helper()
	seen := map[netip.Addr]string{}
	var probs []string
	for _, ct := range cs {
		got := eth0Addr(t, ct)
		if got != ct.Addr {
			probs = append(probs, fmt.Sprintf("%s: eth0 has %v, its ADD result %s", ct.Name, got, ct.Addr))
		}
		if o, dup := seen[ct.Addr.Addr()]; dup {
			probs = append(probs, fmt.Sprintf("%s and %s both hold %s", o, ct.Name, ct.Addr))
		}
		seen[ct.Addr.Addr()] = ct.Name
	}
	if len(probs) > 0 {
		t.Errorf("%d problems: %s", len(probs), strings.Join(probs, "; "))
	}
}

// checkAll runs CNI CHECK on every container, a few at a time.
func checkAll(ctx context.Context, t *testing.T, c *labcluster.Cluster, cs []*labcluster.Container) {
	t.Helper()
	errs := make([]error, len(cs))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, ct := range cs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = c.CheckCNIContainer(ctx, ct)
		})
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Errorf("CHECK failed on %d of %d containers; first: %v", len(failed), len(cs), failed[0])
	}
}
