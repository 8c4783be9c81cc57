// Package vxlan is carve's dataplane: it reconciles the kernel of one network
// namespace, through netlink, to a desired VXLAN overlay state (DESIGN.md,
// "Dataplane").
//
// It owns one VTEP (a VXLAN device), and for every other agent a permanent
// neighbour entry vtep_ip -> vtep_mac on the VTEP, a permanent FDB entry
// vtep_mac -> underlay ip, and a route per subnet via vtep_ip dev VTEP onlink;
// plus the local bridges with their gateway addresses, and ip_forward.
//
// Two entry points: Apply applies only the difference between the last state
// it applied and the new one (cheap, for every membership change); Resync reads
// the kernel back with one dump per table and repairs anything changed by hand.
// Both are idempotent, go on past failing entries, and return a Report.
//
// Ownership: carve marks its routes and neighbours with the Protocol number
// and its links with the OwnerAlias alias, and only ever removes what carries
// the mark (FDB entries, which cannot be marked, are managed only on carve's
// own VTEP). Anything else in the namespace is left alone.
package vxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options configure New.
type Options struct {
	// NetNS is the network namespace to program. The zero value (or
	// netns.None()) means the namespace of the calling process, which is
	// what the agent uses; tests and the demo pass a namespace they created.
	// New opens the namespace again: the caller keeps ownership of its handle.
	NetNS netns.NsHandle
	// Logger receives a summary of each reconcile that changed something and
	// every failed entry (default: slog.Default()).
	Logger *slog.Logger
}

// Dataplane programs one namespace. Its methods are safe for concurrent use
// (reconciles are serialised).
type Dataplane struct {
	log *slog.Logger
	// netns is the namespace programmed, opened by the dataplane; nil
	// means the process's own.
	netns ns.NetNS

	mu                  sync.Mutex
	closed              bool
	warnedAllForwarding bool // the fallback to conf/all/forwarding was logged
	h                   netlinksafe.Handle
	sock                *nlSocket
	// state is what carve knows it has applied; nil until the first full
	// reconcile, and reset to nil when something makes it doubtful.
	state *applied
}

// applied is the last state carve programmed successfully.
type applied struct {
	vtep      VTEP
	vtepIndex int
	entries   *current // carve's entries, as programmed
	bridges   map[string]Bridge
	ipForward bool            // ip_forward known to be on
	forward6  map[string]bool // carve's links known to forward IPv6
}

// New opens netlink sockets in the namespace. Nothing is changed until the
// first Apply or Resync.
func New(opts Options) (*Dataplane, error) {
	d := &Dataplane{log: opts.Logger}
	if d.log == nil {
		d.log = slog.Default()
	}
	handle := netns.None()
	if opts.NetNS > 0 {
		var err error
		if d.netns, err = ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", int(opts.NetNS))); err != nil {
			return nil, fmt.Errorf("vxlan: open the namespace: %w", err)
		}
		handle = netns.NsHandle(d.netns.Fd())
	}
	var err error
	// netlinksafe retries the library's dumps that a concurrent change
	// interrupted.
	if d.h, err = netlinksafe.NewHandleAt(handle, unix.NETLINK_ROUTE); err != nil {
		d.Close()
		return nil, fmt.Errorf("vxlan: netlink handle: %w", err)
	}
	if d.sock, err = openSocket(d.inNS); err != nil {
		d.Close()
		return nil, fmt.Errorf("vxlan: %w", err)
	}
	return d, nil
}

// Close releases the sockets and the namespace handle. It changes nothing in
// the kernel: the dataplane keeps forwarding while the agent restarts.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.h.Close()
	d.sock.close()
	if d.netns != nil {
		d.netns.Close()
	}
	return nil
}

// inNS runs fn on an OS thread inside the dataplane's namespace (directly
// for the process's own). pkg/ns puts the thread back afterwards, or leaves
// it locked for the runtime to discard, so no goroutine ever runs in the
// wrong namespace.
func (d *Dataplane) inNS(fn func() error) error {
	if d.netns == nil {
		return fn()
	}
	return d.netns.Do(func(ns.NetNS) error { return fn() })
}

// Apply makes the kernel match want, touching only what differs from the
// state it applied last (plus a check of the VTEP device). The first Apply,
// and any Apply that finds the VTEP missing, replaced or down, does a full
// Resync instead, since nothing is known about the kernel then. The error is
// nil when everything was applied; otherwise the Report lists every failed
// entry, and those are retried by the next call.
func (d *Dataplane) Apply(ctx context.Context, want Desired) (Report, error) {
	return d.reconcile(ctx, &want, false)
}

// Resync reads the kernel back (the VTEP, its neighbours, its FDB, the main
// routing table, the links) and repairs every difference from want: entries
// deleted or altered by hand are put back, carve's entries that are not
// desired are removed. It is idempotent: a second run changes nothing.
func (d *Dataplane) Resync(ctx context.Context, want Desired) (Report, error) {
	return d.reconcile(ctx, &want, true)
}

func (d *Dataplane) reconcile(ctx context.Context, want *Desired, full bool) (rep Report, err error) {
	start := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() {
		rep.Duration = time.Since(start)
		d.logReport(&rep)
	}()
	if d.closed {
		return rep, errors.New("vxlan: dataplane is closed")
	}
	if err := want.VTEP.validate(); err != nil {
		return rep, fmt.Errorf("vxlan: %w", err)
	}
	prev := d.state
	if prev == nil {
		full = true
	}
	// Until this reconcile completes, what is applied is uncertain.
	d.state = nil

	link, fresh, err := d.ensureVTEP(want.VTEP, prev, full, &rep)
	if err != nil {
		rep.fail(KindVTEP, want.VTEP.Name, "", "ensure", err)
		return rep, rep.Err()
	}
	idx := link.Attrs().Index
	if fresh || prev == nil || prev.vtepIndex != idx {
		full = true
	}
	rep.Full = full

	desired := buildEntries(want, &rep)
	var cur *current
	if full {
		if cur, err = d.sock.readKernel(idx); err != nil {
			rep.fail(KindVTEP, want.VTEP.Name, "", "read back", err)
			return rep, rep.Err()
		}
	} else {
		cur = prev.entries // d.state is nil now: cur is ours to update
	}
	d.execute(ctx, diff(cur, desired), idx, cur, &rep)
	entries := cur

	bridges := d.reconcileBridges(want.Bridges, prev, full, &rep)
	ipForward := want.IPForward && !full && prev != nil && prev.ipForward
	if want.IPForward && !ipForward {
		ipForward = d.setSysctl("net/ipv4/ip_forward", "1", &rep)
	}
	forward6 := map[string]bool{}
	if want.IPv6Forward {
		links := []string{want.VTEP.Name}
		for _, b := range want.Bridges {
			if got, ok := bridges[b.Name]; ok && got.equal(b) {
				links = append(links, b.Name)
			}
		}
		for _, link := range links {
			// Incrementally, a link is looked at again only when it may
			// have been replaced: the VTEP then made this pass full, and
			// a bridge had its spec changed.
			known := !full && prev != nil && prev.forward6[link] &&
				(link == want.VTEP.Name || prev.bridges[link].equal(bridges[link]))
			forward6[link] = known || d.ensureIPv6Forwarding(link, &rep)
		}
	}
	d.state = &applied{vtep: cloneVTEP(want.VTEP), vtepIndex: idx, entries: entries, bridges: bridges,
		ipForward: ipForward, forward6: forward6}
	return rep, rep.Err()
}

// ensureIPv6Forwarding has the kernel forward IPv6 packets that come in on
// one of carve's links (the VTEP, a bridge), and only there: setting
// net.ipv6.conf.all.forwarding instead would turn every interface into a
// router, and an uplink that gets its address or default route from router
// advertisements would stop accepting them. conf/<link>/forwarding makes the
// link a router's (as neighbour discovery announces it); force_forwarding
// (Linux 6.17 and later) forwards what comes in on it whatever conf/all
// says. A kernel without force_forwarding forwards IPv6 only with
// conf/all/forwarding: there it is set, with a warning, since an IPv6
// overlay cannot work otherwise. true means done.
func (d *Dataplane) ensureIPv6Forwarding(link string, rep *Report) bool {
	conf := "net/ipv6/conf/" + link + "/"
	ok := d.setSysctl(conf+"forwarding", "1", rep)
	if d.hasSysctl(conf + "force_forwarding") {
		return d.setSysctl(conf+"force_forwarding", "1", rep) && ok
	}
	if !d.warnedAllForwarding {
		d.warnedAllForwarding = true
		d.log.Warn("vxlan: this kernel cannot forward IPv6 per interface (no net.ipv6.conf.<link>.force_forwarding, Linux < 6.17): "+
			"setting net.ipv6.conf.all.forwarding=1 for the IPv6 overlay; interfaces that rely on router advertisements need accept_ra=2",
			"link", link)
	}
	return d.setSysctl("net/ipv6/conf/all/forwarding", "1", rep) && ok
}

// setSysctl sets a sysctl of the namespace, counting the change or the
// failure in rep; true means it holds value now.
func (d *Dataplane) setSysctl(name, value string, rep *Report) bool {
	changed, err := d.ensureSysctl(name, value)
	switch {
	case err != nil:
		rep.fail(KindSysctl, name, "", "set", err)
		return false
	case changed:
		rep.Sysctls.Updated++
	}
	return true
}

func (d *Dataplane) logReport(rep *Report) {
	if rep.Changes() == 0 && len(rep.Errors) == 0 {
		d.log.Debug("vxlan reconcile: no change", "full", rep.Full, "duration", rep.Duration)
		return
	}
	d.log.Info("vxlan reconcile", "full", rep.Full, "changes", rep.Changes(), "errors", len(rep.Errors),
		"neighbours", rep.Neighbours, "fdb", rep.FDB, "routes", rep.Routes, "vtep", rep.VTEP,
		"bridges", rep.Bridges, "addresses", rep.Addresses, "sysctls", rep.Sysctls, "duration", rep.Duration)
	for i, e := range rep.Errors {
		if i == 20 {
			d.log.Warn("vxlan reconcile: more errors not logged", "count", len(rep.Errors)-i)
			break
		}
		d.log.Warn("vxlan reconcile: entry failed", "kind", e.Kind, "key", e.Key, "peer", e.Peer, "op", e.Op, "err", e.Err)
	}
}

// execute runs the plan in its phases and turns cur into the entries now
// known to be programmed by carve: its own entries, minus successful
// deletions, plus successful sets. A failed set leaves its key out (unknown
// state, so the next Apply tries again); a failed delete keeps it (so it is
// retried). Updating cur in place keeps an incremental Apply from copying
// the whole state.
func (d *Dataplane) execute(ctx context.Context, p *plan, idx int, cur *current, rep *Report) {
	// Entries read back from the kernel that are not carve's are not
	// remembered (FDB entries on the VTEP all are).
	for k, c := range cur.neigh {
		if !c.ours {
			delete(cur.neigh, k)
		}
	}
	for k, c := range cur.route {
		if !c.ours {
			delete(cur.route, k)
		}
	}
	if p.empty() {
		return
	}
	out := cur
	var b batch
	run := func() []error {
		errs := d.sock.exec(&b, ctx.Err)
		b = batch{buf: b.buf[:0], offs: b.offs[:0]}
		return errs
	}
	// Removals: route, FDB, neighbour.
	for _, o := range p.routeDel {
		b.routeDel(o.key)
	}
	for i, err := range run() {
		o := p.routeDel[i]
		switch {
		case err == nil:
			if !o.isNew { // else counted as the update of the prefix
				rep.Routes.Removed++
			}
			delete(out.route, o.key)
		case isGone(err):
			delete(out.route, o.key)
		default:
			rep.fail(KindRoute, routeName(o.key), o.peer, "delete", err)
		}
	}
	for _, o := range p.fdbDel {
		b.fdbDel(idx, o.mac)
	}
	for i, err := range run() {
		o := p.fdbDel[i]
		switch {
		case err == nil:
			rep.FDB.Removed++
			delete(out.fdb, o.mac)
		case isGone(err):
			delete(out.fdb, o.mac)
		default:
			rep.fail(KindFDB, o.mac.String(), o.peer, "delete", err)
		}
	}
	for _, o := range p.neighDel {
		b.neighDel(idx, o.ip)
	}
	for i, err := range run() {
		o := p.neighDel[i]
		switch {
		case err == nil:
			rep.Neighbours.Removed++
			delete(out.neigh, o.ip)
		case isGone(err):
			delete(out.neigh, o.ip)
		default:
			rep.fail(KindNeighbour, o.ip.String(), o.peer, "delete", err)
		}
	}
	// Additions: neighbour, FDB, route.
	for _, o := range p.neighSet {
		b.neighSet(idx, o.ip, o.mac)
	}
	for i, err := range run() {
		o := p.neighSet[i]
		if err != nil {
			rep.fail(KindNeighbour, o.ip.String(), o.peer, opName(o.isNew), err)
			delete(out.neigh, o.ip)
			continue
		}
		count(&rep.Neighbours, o.isNew)
		out.neigh[o.ip] = curNeigh{mac: o.mac, ours: true, good: true}
	}
	for _, o := range p.fdbSet {
		b.fdbSet(idx, o.mac, o.dst)
	}
	for i, err := range run() {
		o := p.fdbSet[i]
		if err != nil {
			rep.fail(KindFDB, o.mac.String(), o.peer, opName(o.isNew), err)
			delete(out.fdb, o.mac)
			continue
		}
		count(&rep.FDB, o.isNew)
		out.fdb[o.mac] = curFDB{dst: o.dst, good: true}
	}
	for _, o := range p.routeSet {
		b.routeSet(idx, o.key, o.via)
	}
	for i, err := range run() {
		o := p.routeSet[i]
		if err != nil {
			rep.fail(KindRoute, routeName(o.key), o.peer, opName(o.isNew), err)
			delete(out.route, o.key)
			continue
		}
		count(&rep.Routes, o.isNew)
		out.route[o.key] = curRoute{via: o.via, ours: true, good: true}
	}
}

func routeName(k routeKey) string {
	return fmt.Sprintf("%s metric %d", k.dst, k.metric)
}

func opName(isNew bool) string {
	if isNew {
		return "add"
	}
	return "replace"
}

func count(c *Counts, isNew bool) {
	if isNew {
		c.Added++
	} else {
		c.Updated++
	}
}

// ensureVTEP makes the VTEP device match v. fresh reports that the device
// was created, replaced or brought up, i.e. that its neighbours, FDB and
// routes may be gone and must be read back.
func (d *Dataplane) ensureVTEP(v VTEP, prev *applied, full bool, rep *Report) (link netlink.Link, fresh bool, err error) {
	// A VTEP carve made under another name (the configured name changed).
	if full {
		links, err := d.h.LinkList()
		if err != nil {
			return nil, false, fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Vxlan); ok && l.Attrs().Alias == OwnerAlias && l.Attrs().Name != v.Name {
				if err := d.h.LinkDel(l); err != nil {
					rep.fail(KindVTEP, l.Attrs().Name, "", "delete", err)
				} else {
					rep.VTEP.Removed++
				}
			}
		}
	} else if prev != nil && prev.vtep.Name != v.Name {
		if l, err := d.h.LinkByName(prev.vtep.Name); err == nil && l.Attrs().Alias == OwnerAlias {
			if err := d.h.LinkDel(l); err != nil {
				rep.fail(KindVTEP, prev.vtep.Name, "", "delete", err)
			} else {
				rep.VTEP.Removed++
			}
		}
	}

	link, err = d.h.LinkByName(v.Name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		link, err = d.createVTEP(v)
		if err != nil {
			return nil, false, err
		}
		rep.VTEP.Added++
		rep.Addresses.Added++
		return link, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("look up %s: %w", v.Name, err)
	}
	if why := vtepMismatch(link, v); why != "" {
		// A device that is not a VXLAN device is only replaced when carve
		// made it; VXLAN devices of this name are the VTEP (e.g. one left
		// by a DC/OS overlay agent) and are replaced when they differ.
		if _, isVX := link.(*netlink.Vxlan); !isVX && link.Attrs().Alias != OwnerAlias {
			return nil, false, fmt.Errorf("%s exists and is a %s device that carve did not create", v.Name, link.Type())
		}
		d.log.Info("vxlan: replacing VTEP", "name", v.Name, "reason", why)
		if err := d.h.LinkDel(link); err != nil {
			return nil, false, fmt.Errorf("delete mismatched %s: %w", v.Name, err)
		}
		link, err = d.createVTEP(v)
		if err != nil {
			return nil, false, err
		}
		rep.VTEP.Updated++
		rep.Addresses.Added++
		return link, true, nil
	}
	// Matching device: fix in place only what does not disturb its entries.
	// The MAC is never set again (that flushes the neighbours).
	changed := false
	if v.MTU != 0 && link.Attrs().MTU != v.MTU {
		if err := d.h.LinkSetMTU(link, v.MTU); err != nil {
			return nil, false, fmt.Errorf("set MTU of %s: %w", v.Name, err)
		}
		changed = true
	}
	if link.Attrs().Alias != OwnerAlias {
		if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
			return nil, false, fmt.Errorf("mark %s: %w", v.Name, err)
		}
		changed = true
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		// Taking a device down drops its routes: they must be re-read.
		if err := d.h.LinkSetUp(link); err != nil {
			return nil, false, fmt.Errorf("set %s up: %w", v.Name, err)
		}
		changed, fresh = true, true
	}
	if changed {
		rep.VTEP.Updated++
	}
	// Checked on every pass (one small dump). A missing address means
	// someone removed it, and removing a device's last IPv4 address flushes
	// its routes and neighbours: read them back then.
	if d.ensureAddrs(link, v.addresses(), KindAddress, v.Name, rep) && prev != nil && prev.vtep.Address == v.Address {
		fresh = true
	}
	return link, fresh, nil
}

// vtepMismatch says why an existing link cannot serve as the VTEP v, or ""
// when it can (MTU, alias and up state are fixed in place).
func vtepMismatch(l netlink.Link, v VTEP) string {
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return "not a vxlan device but " + l.Type()
	}
	local, _ := netip.AddrFromSlice(vx.SrcAddr)
	switch {
	case vx.VxlanId != int(v.VNI):
		return fmt.Sprintf("VNI %d, want %d", vx.VxlanId, v.VNI)
	case vx.Port != int(v.Port):
		return fmt.Sprintf("port %d, want %d", vx.Port, v.Port)
	case local.Unmap() != v.Local.Unmap():
		return fmt.Sprintf("local %v, want %s", vx.SrcAddr, v.Local)
	case vx.Learning:
		return "learning on"
	case vx.FlowBased:
		return "external (flow based)"
	case len(vx.Group) > 0 && !vx.Group.IsUnspecified():
		return "multicast group " + vx.Group.String()
	case vx.VtepDevIndex != 0:
		return "bound to an underlay device"
	case !slices.Equal(vx.HardwareAddr, v.MAC):
		return fmt.Sprintf("MAC %s, want %s", vx.HardwareAddr, v.MAC)
	}
	return ""
}

func (d *Dataplane) createVTEP(v VTEP) (netlink.Link, error) {
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: v.Name, MTU: v.MTU, HardwareAddr: slices.Clone(v.MAC)},
		VxlanId:   int(v.VNI),
		SrcAddr:   net.IP(v.Local.Unmap().AsSlice()),
		Port:      int(v.Port),
		Learning:  false,
		UDPCSum:   true,
	}
	if err := d.h.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("create %s: %w", v.Name, err)
	}
	link, err := d.h.LinkByName(v.Name)
	if err != nil {
		return nil, fmt.Errorf("look up new %s: %w", v.Name, err)
	}
	if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
		return nil, fmt.Errorf("mark %s: %w", v.Name, err)
	}
	if err := d.h.AddrReplace(link, &netlink.Addr{IPNet: ipNet(v.Address)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", v.Address, v.Name, err)
	}
	if v.Address6.IsValid() {
		// No duplicate address detection: the address would stay tentative.
		if err := d.h.AddrReplace(link, &netlink.Addr{IPNet: ipNet(v.Address6), Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("address %s on %s: %w", v.Address6, v.Name, err)
		}
	}
	if err := d.h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", v.Name, err)
	}
	return d.h.LinkByName(v.Name)
}

// ensureAddrs makes want the global addresses of a carve link: missing ones
// are added, then other global ones removed (link-local and host-scope
// addresses are the kernel's and stay). Adding first matters: removing the
// last IPv4 address of a device makes the kernel flush its routes and
// neighbours. missing reports that a wanted address was not there.
func (d *Dataplane) ensureAddrs(link netlink.Link, want []netip.Prefix, kind Kind, name string, rep *Report) (missing bool) {
	// netlinksafe wraps only the package-level address dump, which opens
	// its socket in the calling thread's namespace.
	var have []netlink.Addr
	err := d.inNS(func() error {
		var err error
		have, err = netlinksafe.AddrList(link, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		rep.fail(kind, name, "", "list addresses", err)
		return true
	}
	present := map[netip.Prefix]bool{}
	var extra []netlink.Addr
	for _, a := range have {
		p, ok := prefixOf(a.IPNet)
		if !ok || a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		if slices.Contains(want, p) {
			present[p] = true
		} else {
			extra = append(extra, a)
		}
	}
	for _, p := range want {
		if present[p] {
			continue
		}
		missing = true
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			// No duplicate address detection: the gateway would stay
			// tentative (unusable) for a second or more.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := d.h.AddrReplace(link, a); err != nil {
			rep.fail(KindAddress, p.String(), "", "add", err)
		} else {
			rep.Addresses.Added++
		}
	}
	for _, a := range extra {
		p, _ := prefixOf(a.IPNet)
		if err := d.h.AddrDel(link, &a); err != nil {
			rep.fail(KindAddress, p.String(), "", "delete", err)
		} else {
			rep.Addresses.Removed++
		}
	}
	return missing
}

// reconcileBridges creates or fixes the desired bridges and deletes carve's
// bridges that are no longer desired. Incrementally, only bridges whose
// desired spec changed are looked at.
func (d *Dataplane) reconcileBridges(want []Bridge, prev *applied, full bool, rep *Report) map[string]Bridge {
	out := map[string]Bridge{}
	wanted := map[string]bool{}
	for _, b := range want {
		if err := b.validate(); err != nil {
			rep.fail(KindBridge, b.Name, "", "validate", err)
			continue
		}
		if wanted[b.Name] {
			rep.fail(KindBridge, b.Name, "", "validate", errors.New("bridge named twice"))
			continue
		}
		wanted[b.Name] = true
		if !full && prev != nil {
			if old, ok := prev.bridges[b.Name]; ok && old.equal(b) {
				out[b.Name] = b
				continue
			}
		}
		if err := d.ensureBridge(b, rep); err != nil {
			rep.fail(KindBridge, b.Name, "", "ensure", err)
			continue
		}
		out[b.Name] = b
	}
	var stale []string
	if full {
		links, err := d.h.LinkList()
		if err != nil {
			rep.fail(KindBridge, "*", "", "list links", err)
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Bridge); ok && l.Attrs().Alias == OwnerAlias && !wanted[l.Attrs().Name] {
				stale = append(stale, l.Attrs().Name)
			}
		}
	} else if prev != nil {
		for name := range prev.bridges {
			if !wanted[name] {
				stale = append(stale, name)
			}
		}
	}
	for _, name := range stale {
		l, err := d.h.LinkByName(name)
		if err != nil {
			continue // already gone
		}
		if _, ok := l.(*netlink.Bridge); !ok || l.Attrs().Alias != OwnerAlias {
			continue // not carve's (any more): leave it
		}
		if err := d.h.LinkDel(l); err != nil {
			rep.fail(KindBridge, name, "", "delete", err)
			out[name] = Bridge{Name: name} // retried next time
			continue
		}
		rep.Bridges.Removed++
	}
	return out
}

func (d *Dataplane) ensureBridge(b Bridge, rep *Report) error {
	created := false
	link, err := d.h.LinkByName(b.Name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		link = nil
	case err != nil:
		return err
	default:
		if _, ok := link.(*netlink.Bridge); !ok {
			if link.Attrs().Alias != OwnerAlias {
				return fmt.Errorf("%s exists and is a %s device that carve did not create", b.Name, link.Type())
			}
			if err := d.h.LinkDel(link); err != nil {
				return fmt.Errorf("delete non-bridge %s: %w", b.Name, err)
			}
			link = nil
		}
	}
	if link == nil {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: b.Name, MTU: b.MTU}}
		if err := d.h.LinkAdd(br); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		created = true
		if link, err = d.h.LinkByName(b.Name); err != nil {
			return err
		}
		if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
			return fmt.Errorf("mark: %w", err)
		}
		if err := d.pinMAC(link); err != nil {
			return err
		}
		rep.Bridges.Added++
	} else {
		changed := false
		if link.Attrs().Alias != OwnerAlias {
			// Adopted: it has the name the desired state gives a carve bridge.
			if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
				return fmt.Errorf("mark: %w", err)
			}
			if err := d.pinMAC(link); err != nil {
				return err
			}
			changed = true
		}
		if b.MTU != 0 && link.Attrs().MTU != b.MTU {
			if err := d.h.LinkSetMTU(link, b.MTU); err != nil {
				return fmt.Errorf("set MTU: %w", err)
			}
			changed = true
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			changed = true
		}
		if changed {
			rep.Bridges.Updated++
		}
	}
	if b.Gateway6.IsValid() {
		// Linux solicits neighbours for forwarded IPv6 packets only from a
		// usable link-local address, which duplicate address detection
		// keeps tentative for a second or two after the bridge gets a
		// port: containers could not be reached from other hosts then.
		// The bridge is carve's, so it skips DAD (before it is up).
		changed, err := d.ensureSysctl("net/ipv6/conf/"+b.Name+"/accept_dad", "0")
		switch {
		case err != nil:
			rep.fail(KindSysctl, b.Name+" accept_dad", "", "set", err)
		case changed && !created:
			rep.Sysctls.Updated++
		}
	}
	// A block the agent granted away can lie inside the prefix of its own
	// containers (a /30 out of its first /28): for them it is on-link, so
	// they ARP for it on the bridge, while the kernel routes it out of the
	// VTEP to the recipient. With proxy_arp the bridge answers for exactly
	// the targets it routes out of another interface; local containers
	// (routed on the bridge itself) still answer for themselves.
	changed, err := d.ensureSysctl("net/ipv4/conf/"+b.Name+"/proxy_arp", "1")
	switch {
	case err != nil:
		rep.fail(KindSysctl, b.Name+" proxy_arp", "", "set", err)
	case changed && !created:
		rep.Sysctls.Updated++
	}
	d.ensureAddrs(link, b.addresses(), KindBridge, b.Name, rep)
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := d.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

// pinMAC sets a bridge's MAC to the one it has. A bridge whose MAC was never
// set takes the lowest MAC of its ports and changes it as containers come
// and go: the gateway MAC in the containers' ARP caches goes stale, and the
// CNI bridge plugin's CHECK fails for every container attached before the
// change (it compares the bridge MAC of the ADD result). The bridge plugin
// pins the MAC itself only when it adds the gateway address, which carve
// has already put there. Setting a MAC notifies
// NETDEV_CHANGEADDR, which flushes the bridge's neighbours, so it is done
// once, when carve creates or adopts the bridge.
func (d *Dataplane) pinMAC(link netlink.Link) error {
	if err := d.h.LinkSetHardwareAddr(link, link.Attrs().HardwareAddr); err != nil {
		return fmt.Errorf("pin MAC %s: %w", link.Attrs().HardwareAddr, err)
	}
	return nil
}

// ensureSysctl sets a sysctl under /proc/sys/net (name is the path below
// /proc/sys, e.g. "net/ipv4/ip_forward") inside the dataplane's namespace,
// when it differs. It runs on a thread inside the namespace because
// /proc/sys/net resolves against the network namespace of the thread that
// opens it.
func (d *Dataplane) ensureSysctl(name, value string) (changed bool, err error) {
	if !strings.HasPrefix(name, "net/") || strings.Contains(name, "..") {
		return false, fmt.Errorf("refusing sysctl %q outside /proc/sys/net", name)
	}
	err = d.inNS(func() error {
		cur, err := sysctl.Sysctl(name)
		if err != nil {
			return err
		}
		if strings.TrimSpace(cur) == value {
			return nil
		}
		changed = true
		_, err = sysctl.Sysctl(name, value)
		return err
	})
	return changed, err
}

// hasSysctl reports whether the kernel has a sysctl under /proc/sys/net in
// the dataplane's namespace.
func (d *Dataplane) hasSysctl(name string) bool {
	return d.inNS(func() error {
		_, err := os.Stat("/proc/sys/" + name)
		return err
	}) == nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

func cloneVTEP(v VTEP) VTEP {
	v.MAC = slices.Clone(v.MAC)
	return v
}
