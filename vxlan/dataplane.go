// Package vxlan is carve's dataplane: it reconciles the kernel of one network
// namespace, through netlink, to a desired VXLAN overlay state (DESIGN.md,
// "Dataplane").
//
// It owns one VTEP (a VXLAN device), and for every other agent a permanent
// neighbour entry vtep_ip -> vtep_mac on the VTEP, a permanent FDB entry
// vtep_mac -> underlay ip, and a route per subnet via vtep_ip dev VTEP onlink;
// plus the local bridges with their gateway addresses, and ip_forward. In
// routed mode (Desired.Routed, routed.go) a peer on this host's underlay
// segment gets plain routes via its underlay IP instead, no tunnel.
//
// Two entry points: Apply applies only the difference between the last state
// it applied and the new one (cheap, for every membership change); Resync reads
// the kernel back with one dump per table and repairs anything changed by hand.
// Both are idempotent, go on past failing entries, and return a Report.
//
// Ownership: carve marks its routes and neighbours with the Protocol number
// and its links with the OwnerAlias alias, and only ever removes what carries
// the mark (FDB entries, which cannot be marked, are managed only on carve's
// own VTEP). Anything else in the namespace is left alone, but for one
// kernel-learned neighbour entry on a carve bridge: ForgetNeighbour deletes
// that of a container address the agent just freed.
package vxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
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
	// NoFastPath leaves routed peers' traffic to the kernel's forwarding
	// (and netfilter's FORWARD chain) instead of the eBPF shortcut
	// (fastpath.go).
	NoFastPath bool
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
	// fast is the routed data path's eBPF shortcut, loaded while routed
	// peers exist (nil otherwise); fastErr its last failure.
	fast       *fastPath
	fastErr    error
	noFastPath bool

	// nmu guards nh, the socket of ForgetNeighbour: its own, so that a
	// container's release never waits for a reconcile.
	nmu     sync.Mutex
	nclosed bool
	nh      netlinksafe.Handle
}

// applied is the last state carve programmed successfully.
type applied struct {
	vtep      VTEP
	vtepIndex int
	entries   *current // carve's entries, as programmed
	bridges   map[string]Bridge
	ipForward bool            // ip_forward known to be on
	forward6  map[string]bool // carve's links known to forward IPv6
	rpLoose   string          // "underlay,vtep": the devices known to filter reverse paths loosely (routed mode)
}

// New opens netlink sockets in the namespace. Nothing is changed until the
// first Apply or Resync.
func New(opts Options) (*Dataplane, error) {
	d := &Dataplane{log: opts.Logger, noFastPath: opts.NoFastPath}
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
	if d.nh, err = netlinksafe.NewHandleAt(handle, unix.NETLINK_ROUTE); err != nil {
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
// the kernel but for detaching the fast path: the dataplane keeps
// forwarding while the agent restarts (routed peers' traffic through the
// kernel's own forwarding until the next agent attaches it again).
func (d *Dataplane) Close() error {
	d.nmu.Lock()
	if !d.nclosed {
		d.nclosed = true
		d.nh.Close()
	}
	d.nmu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	// The fast path's links end with their file descriptors, in any
	// namespace; its watch ends once it sees the dataplane closed.
	f := d.closeFastPath()
	d.h.Close()
	d.sock.close()
	d.mu.Unlock()
	if f != nil {
		<-f.stopped
	}
	d.mu.Lock()
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

	u := d.underlayFor(want, &rep)
	desired := buildEntries(want, &rep, idx, u)
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
	d.syncFastPath(u, desired, bridges, full, &rep)
	rpLoose := ""
	if u != nil && rep.PeersByMode()[ModeRouted] > 0 {
		devs := u.name + "," + want.VTEP.Name
		if (!full && prev != nil && prev.rpLoose == devs) || d.ensureLooseRPFilter(u, want.VTEP.Name, &rep) {
			rpLoose = devs
		}
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
		ipForward: ipForward, forward6: forward6, rpLoose: rpLoose}
	return rep, rep.Err()
}

func (d *Dataplane) logReport(rep *Report) {
	if rep.Changes() == 0 && len(rep.Errors) == 0 {
		d.log.Debug("vxlan reconcile: no change", "full", rep.Full, "duration", rep.Duration)
		return
	}
	d.log.Info("vxlan reconcile", "full", rep.Full, "changes", rep.Changes(), "errors", len(rep.Errors),
		"neighbours", rep.Neighbours, "fdb", rep.FDB, "routes", rep.Routes, "vtep", rep.VTEP,
		"bridges", rep.Bridges, "addresses", rep.Addresses, "sysctls", rep.Sysctls,
		"routed_peers", rep.PeersByMode()[ModeRouted], "duration", rep.Duration)
	for i, e := range rep.Errors {
		if i == 20 {
			d.log.Warn("vxlan reconcile: more errors not logged", "count", len(rep.Errors)-i)
			break
		}
		d.log.Warn("vxlan reconcile: entry failed", "kind", e.Kind, "key", e.Key, "peer", e.Peer, "op", e.Op, "err", e.Err)
	}
}
