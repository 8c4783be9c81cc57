// Command vxlan benchmarks the dataplane: the time to program N remote agents
// from scratch with carve's batched reconcile, per peer, beside the plain
// approach (neighbour, FDB entry and route added one by one with the ordinary
// netlink library calls) measured in the same run, each in a fresh network
// namespace. It needs root; everything happens inside namespaces it creates
// and removes (also on SIGINT/SIGTERM).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// labs are the live labs, closed by the signal handler.
var (
	labsMu sync.Mutex
	labs   = map[*netnslab.Lab]bool{}
)

// release deletes the VTEP first, synchronously: the kernel then drops its
// entries inside this call, instead of in the background when the namespace
// goes, where it would compete with the next measurement for the CPU.
func release(lab *netnslab.Lab, ns *netnslab.Namespace) {
	if h, err := ns.Netlink(); err == nil {
		if l, err := h.LinkByName("vtep1024"); err == nil {
			_ = h.LinkDel(l)
		}
	}
	closeLab(lab)
}

func newNS() (*netnslab.Lab, *netnslab.Namespace, error) {
	lab, err := netnslab.New(netnslab.Options{Prefix: "carvebench"})
	if err != nil {
		return nil, nil, err
	}
	labsMu.Lock()
	labs[lab] = true
	labsMu.Unlock()
	ns, err := lab.AddNamespace("h")
	if err != nil {
		closeLab(lab)
		return nil, nil, err
	}
	return lab, ns, nil
}

func closeLab(lab *netnslab.Lab) {
	labsMu.Lock()
	delete(labs, lab)
	labsMu.Unlock()
	if err := lab.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close lab:", err)
	}
}

func closeAll() {
	labsMu.Lock()
	all := make([]*netnslab.Lab, 0, len(labs))
	for l := range labs {
		all = append(all, l)
	}
	labsMu.Unlock()
	for _, l := range all {
		closeLab(l)
	}
}

func main() {
	reps := flag.Int("reps", 5, "repetitions of each measurement (the median is reported)")
	flag.Parse()
	if !netnslab.IsRoot() {
		fmt.Fprintln(os.Stderr, "bench/vxlan: needs root to create network namespaces")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintln(os.Stderr, "bench/vxlan:", s, "- removing namespaces")
		closeAll()
		os.Exit(130)
	}()
	err := run(*reps)
	closeAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/vxlan:", err)
		os.Exit(1)
	}
}

func run(reps int) error {
	t := benchtable.Table{Title: "vxlan dataplane (netlink, fresh network namespace per run)"}
	perPeer := map[int]float64{}
	for _, n := range []int{100, 1000, 10000} {
		carve, err := median(reps, func() (time.Duration, error) { return carveFull(n) })
		if err != nil {
			return err
		}
		plain, err := median(reps, func() (time.Duration, error) { return plainFull(n, false) })
		if err != nil {
			return err
		}
		perPeer[n] = us(carve) / float64(n)
		t.Add(benchtable.Row{
			Name:     fmt.Sprintf("full reconcile, %d peers, per peer", n),
			Value:    us(carve) / float64(n),
			Unit:     "µs/peer",
			Baseline: "plain: 3 netlink calls per peer",
			BaseVal:  us(plain) / float64(n),
			Note:     fmt.Sprintf("total %s vs %s; median of %d", carve.Round(time.Millisecond), plain.Round(time.Millisecond), reps),
		})
	}
	// The same at 10000 with the plain calls given carve's per-peer route
	// metrics: what batching alone gains, without the kernel's hash chain.
	plainM, err := median(reps, func() (time.Duration, error) { return plainFull(10000, true) })
	if err != nil {
		return err
	}
	t.Add(benchtable.Row{
		Name:     "full reconcile, 10000 peers, per peer",
		Value:    perPeer[10000],
		Unit:     "µs/peer",
		Baseline: "plain, with carve's route metrics",
		BaseVal:  us(plainM) / 10000,
		Note:     "batching alone; total " + plainM.Round(time.Millisecond).String() + " for plain",
	})
	noop, join, joinPlain, joinFull, err := steadyState(10000, reps)
	if err != nil {
		return err
	}
	t.Add(benchtable.Row{
		Name:     "Resync with nothing to change, 10000 peers, per peer",
		Value:    us(noop) / 10000,
		Unit:     "µs/peer",
		Baseline: "full reconcile of the same peers",
		BaseVal:  perPeer[10000],
		Note:     "3 dumps + diff; total " + noop.Round(time.Millisecond).String(),
	})
	t.Add(benchtable.Row{
		Name:     "one agent joins 10000: incremental Apply",
		Value:    us(join),
		Unit:     "µs",
		Baseline: "Resync for the same change",
		BaseVal:  us(joinFull),
		Note:     fmt.Sprintf("plain 3 calls alone: %.0f µs", us(joinPlain)),
	})
	if ratio := perPeer[10000] / perPeer[100]; ratio > 0 {
		t.Add(benchtable.Row{
			Name:     "linearity: per-peer cost at 10000",
			Value:    perPeer[10000],
			Unit:     "µs/peer",
			Baseline: "per-peer cost at 100",
			BaseVal:  perPeer[100],
			Note:     "near 1x = linear",
		})
	}
	return t.Print(os.Stdout)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(reps int, f func() (time.Duration, error)) (time.Duration, error) {
	var ds []time.Duration
	for range max(reps, 1) {
		d, err := f()
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

var quiet = slog.New(slog.DiscardHandler)

// desired is agent 1 with peers 2..n+1 (addresses as the masters lease them).
func desired(n int) vxlan.Desired {
	d := vxlan.Desired{
		VTEP: vxlan.VTEP{Name: "vtep1024", VNI: 1024, Port: 4789, Local: underlay(1), MAC: vtepMAC(1), MTU: 1450,
			Address: netip.PrefixFrom(vtepIP(1), 16)},
		Bridges:   []vxlan.Bridge{{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.1.1/25"), MTU: 1420}},
		IPForward: true,
	}
	for i := 2; i < n+2; i++ {
		d.Peers = append(d.Peers, peer(i))
	}
	return d
}

func peer(i int) vxlan.Peer {
	return vxlan.Peer{ID: fmt.Sprintf("a%d", i), UnderlayIP: underlay(i), VTEPIP: vtepIP(i), VTEPMAC: vtepMAC(i),
		Subnets: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>8), byte(i), 0}), 24)}}
}

func vtepIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}) }

func vtepMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x70, 0xb3, 0xd5, 0x40, byte(i >> 8), byte(i)}
}

func underlay(i int) netip.Addr {
	v := 10 + i
	return netip.AddrFrom4([4]byte{198, 18, byte(v >> 8), byte(v)})
}

// carveFull times the first reconcile of n peers in a fresh namespace
// (VTEP, bridge, read back, all entries).
func carveFull(n int) (time.Duration, error) {
	lab, ns, err := newNS()
	if err != nil {
		return 0, err
	}
	defer release(lab, ns)
	dp, err := vxlan.New(vxlan.Options{NetNS: ns.NsHandle(), Logger: quiet})
	if err != nil {
		return 0, err
	}
	defer dp.Close()
	d := desired(n)
	start := time.Now()
	rep, err := dp.Resync(context.Background(), d)
	el := time.Since(start)
	if err != nil {
		return 0, err
	}
	if rep.Routes.Added != n {
		return 0, fmt.Errorf("carve: %d routes added, want %d", rep.Routes.Added, n)
	}
	return el, nil
}

// plainFull times the plain approach for the same state: the VTEP created
// with the netlink library, then neighbour, FDB entry and route per peer,
// one call each. withMetric gives the routes carve's metrics.
func plainFull(n int, withMetric bool) (time.Duration, error) {
	lab, ns, err := newNS()
	if err != nil {
		return 0, err
	}
	defer release(lab, ns)
	h, err := ns.Netlink()
	if err != nil {
		return 0, err
	}
	d := desired(n)
	start := time.Now()
	v := d.VTEP
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: v.Name, MTU: v.MTU, HardwareAddr: v.MAC},
		VxlanId: int(v.VNI), Port: int(v.Port), SrcAddr: net.IP(v.Local.AsSlice())}
	if err := h.LinkAdd(vx); err != nil {
		return 0, err
	}
	link, err := h.LinkByName(v.Name)
	if err != nil {
		return 0, err
	}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipNet(v.Address)}); err != nil {
		return 0, err
	}
	if err := h.LinkSetUp(link); err != nil {
		return 0, err
	}
	idx := link.Attrs().Index
	for _, p := range d.Peers {
		if err := plainPeer(h, idx, p, withMetric); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func plainPeer(h *netlink.Handle, idx int, p vxlan.Peer, withMetric bool) error {
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, IP: net.IP(p.VTEPIP.AsSlice()), HardwareAddr: p.VTEPMAC,
		State: netlink.NUD_PERMANENT}); err != nil {
		return fmt.Errorf("plain neighbour: %w", err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, HardwareAddr: p.VTEPMAC, IP: net.IP(p.UnderlayIP.AsSlice())}); err != nil {
		return fmt.Errorf("plain fdb: %w", err)
	}
	r := &netlink.Route{LinkIndex: idx, Gw: net.IP(p.VTEPIP.AsSlice()), Flags: int(netlink.FLAG_ONLINK), Dst: ipNet(p.Subnets[0])}
	if withMetric {
		r.Priority = int(vxlan.RouteMetric(p.VTEPIP))
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("plain route: %w", err)
	}
	return nil
}

// steadyState measures, with n peers programmed: a Resync that finds nothing
// to do; one agent joining through Apply; the same join through Resync; and
// the plain three calls for one agent.
func steadyState(n, reps int) (noop, join, joinPlain, joinFull time.Duration, err error) {
	lab, ns, err := newNS()
	if err != nil {
		return
	}
	defer release(lab, ns)
	dp, err := vxlan.New(vxlan.Options{NetNS: ns.NsHandle(), Logger: quiet})
	if err != nil {
		return
	}
	defer dp.Close()
	h, err := ns.Netlink()
	if err != nil {
		return
	}
	ctx := context.Background()
	base := desired(n)
	if _, err = dp.Resync(ctx, base); err != nil {
		return
	}
	grown := desired(n + 1)
	check := func(rep vxlan.Report, err error, want int) error {
		if err != nil {
			return err
		}
		if rep.Changes() != want {
			return fmt.Errorf("%d changes, want %d", rep.Changes(), want)
		}
		return nil
	}
	if noop, err = median(reps, func() (time.Duration, error) {
		start := time.Now()
		rep, err := dp.Resync(ctx, base)
		return time.Since(start), check(rep, err, 0)
	}); err != nil {
		return
	}
	timeJoin := func(full bool) (time.Duration, error) {
		start := time.Now()
		var rep vxlan.Report
		var err error
		if full {
			rep, err = dp.Resync(ctx, grown)
		} else {
			rep, err = dp.Apply(ctx, grown)
		}
		el := time.Since(start)
		if err := check(rep, err, 3); err != nil {
			return 0, err
		}
		_, err = dp.Apply(ctx, base) // leave again, untimed
		return el, err
	}
	if join, err = median(reps, func() (time.Duration, error) { return timeJoin(false) }); err != nil {
		return
	}
	if joinFull, err = median(reps, func() (time.Duration, error) { return timeJoin(true) }); err != nil {
		return
	}
	link, err := h.LinkByName("vtep1024")
	if err != nil {
		return
	}
	p := grown.Peers[len(grown.Peers)-1]
	joinPlain, err = median(reps, func() (time.Duration, error) {
		start := time.Now()
		err := plainPeer(h, link.Attrs().Index, p, false)
		el := time.Since(start)
		if err != nil {
			return 0, err
		}
		return el, plainRemove(h, link.Attrs().Index, p) // untimed

	})
	return
}

// plainRemove undoes plainPeer: route, FDB entry, neighbour.
func plainRemove(h *netlink.Handle, idx int, p vxlan.Peer) error {
	if err := h.RouteDel(&netlink.Route{LinkIndex: idx, Dst: ipNet(p.Subnets[0])}); err != nil {
		return fmt.Errorf("plain route delete: %w", err)
	}
	if err := h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		HardwareAddr: p.VTEPMAC, IP: net.IP(p.UnderlayIP.AsSlice())}); err != nil {
		return fmt.Errorf("plain fdb delete: %w", err)
	}
	if err := h.NeighDel(&netlink.Neigh{LinkIndex: idx, IP: net.IP(p.VTEPIP.AsSlice())}); err != nil {
		return fmt.Errorf("plain neighbour delete: %w", err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
