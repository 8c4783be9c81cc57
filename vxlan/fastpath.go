package vxlan

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carve-net/carve/fastpath"
)

// The fast path's states in Report.FastPath.
const (
	// FastPathOn: the eBPF shortcut (package fastpath) forwards the routed
	// peers' IPv4 traffic.
	FastPathOn = "on"
	// FastPathOff: routed mode without the shortcut (turned off in
	// Options, or no routed peer); the kernel forwards.
	FastPathOff = "off"
	// FastPathUnavailable prefixes the reason the kernel cannot run it.
	FastPathUnavailable = "unavailable"
)

// fastPath is the loaded shortcut and the watch that attaches it to a
// container's port as soon as the port joins a carve bridge.
type fastPath struct {
	path *fastpath.Path
	// bridges are the carve bridges' ifindexes and MACs at the last sync:
	// the watch's test of a new port.
	bridges map[int][6]byte
	stop    chan struct{} // closed to end the watch
	stopped chan struct{} // closed when it has ended
}

// syncFastPath points the fast path at what this reconcile programmed: the
// routed peers' IPv4 routes (desired entries whose device is the underlay),
// the IPv4 blocks of the bridges in place and the bridges' ports. It never
// fails the reconcile: without the shortcut the kernel forwards the same
// packets the same way, only slower. u is nil when routed mode is off.
func (d *Dataplane) syncFastPath(u *underlay, desired *entrySet, bridges map[string]Bridge, full bool, rep *Report) {
	want := fastpath.Want{Blocks: map[netip.Prefix]fastpath.Target{}, Ports: map[int]fastpath.Port{}}
	if u != nil && !d.noFastPath {
		for k, r := range desired.route {
			if r.oif == u.index && k.dst.Addr().Is4() {
				want.Blocks[k.dst.Masked()] = fastpath.Target{Ifindex: u.index, Kind: fastpath.KindPeer}
			}
		}
	}
	if len(want.Blocks) == 0 { // nothing routed: nothing to shortcut
		d.closeFastPath()
		if u != nil {
			rep.FastPath = FastPathOff
		}
		return
	}
	brs := map[int][6]byte{}
	for _, b := range bridges {
		l, err := d.h.LinkByName(b.Name)
		if err != nil || len(l.Attrs().HardwareAddr) != 6 {
			continue // reported by the bridges' reconcile; retried with it
		}
		brs[l.Attrs().Index] = [6]byte(l.Attrs().HardwareAddr)
		for _, a := range b.addresses() {
			if a.Addr().Is4() {
				want.Blocks[a.Masked()] = fastpath.Target{Ifindex: l.Attrs().Index, Kind: fastpath.KindLocal}
			}
		}
	}
	links, err := d.h.LinkList()
	if err != nil {
		// Without the ports, a Sync would detach every container's; the
		// fast path stays as it is until the next reconcile.
		d.noteFastPathErr(fmt.Errorf("fastpath: list the bridges' ports: %w", err))
		rep.FastPath = d.fastState()
		return
	}
	for _, l := range links {
		if mac, ok := brs[l.Attrs().MasterIndex]; ok {
			want.Ports[l.Attrs().Index] = fastpath.Port{Bridge: l.Attrs().MasterIndex, MAC: mac}
		}
	}
	if d.fast == nil {
		if d.fastErr != nil && !full {
			rep.FastPath = d.fastState()
			return // tried at the last full reconcile; again at the next
		}
		p, err := fastpath.New()
		d.noteFastPathErr(err)
		if err != nil {
			rep.FastPath = d.fastState()
			return
		}
		d.fast, full = &fastPath{path: p, stop: make(chan struct{}), stopped: make(chan struct{})}, true
		d.startPortWatch(d.fast)
	}
	d.fast.bridges = brs
	err = d.inNS(func() error { return d.fast.path.Sync(want, full) })
	d.noteFastPathErr(err)
	rep.FastPath = d.fastState()
}

// closeFastPath detaches and unloads the fast path, if loaded, and ends its
// watch without waiting for it (the caller holds d.mu, which the watch may
// be waiting for); the watch then finds the fast path gone and ends.
func (d *Dataplane) closeFastPath() *fastPath {
	f := d.fast
	if f == nil {
		return nil
	}
	d.fast = nil
	close(f.stop)
	if err := f.path.Close(); err != nil {
		d.log.Warn("fast path: detach", "err", err)
	}
	return f
}

// startPortWatch follows the namespace's links, so that a container's port
// is shortcut as soon as it joins a carve bridge (and forgotten as soon as
// it is gone) rather than at the next reconcile.
func (d *Dataplane) startPortWatch(f *fastPath) {
	updates := make(chan netlink.LinkUpdate, 64)
	opts := netlink.LinkSubscribeOptions{ErrorCallback: func(err error) {
		d.log.Debug("fast path: link watch", "err", err)
	}}
	if d.netns != nil {
		h := netns.NsHandle(d.netns.Fd())
		opts.Namespace = &h
	}
	if err := netlink.LinkSubscribeWithOptions(updates, f.stop, opts); err != nil {
		close(f.stopped)
		d.log.Warn("fast path: cannot watch links; containers' ports are shortcut at the next reconcile", "err", err)
		return
	}
	go func() {
		defer close(f.stopped)
		for u := range updates {
			d.portChanged(f, u)
		}
	}()
}

// portChanged shortcuts a port that joined a carve bridge, and forgets one
// that left or is gone.
func (d *Dataplane) portChanged(f *fastPath, u netlink.LinkUpdate) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast != f || d.closed {
		return // closed or replaced since
	}
	idx := int(u.Index)
	mac, isPort := f.bridges[u.Attrs().MasterIndex]
	var err error
	switch {
	case u.Header.Type == unix.RTM_NEWLINK && isPort:
		port := fastpath.Port{Bridge: u.Attrs().MasterIndex, MAC: mac}
		err = d.inNS(func() error { return f.path.AddPort(idx, port) })
	case f.path.HasPort(idx) && (u.Header.Type == unix.RTM_DELLINK || !isPort):
		err = f.path.RemovePort(idx)
	}
	if err != nil {
		d.log.Warn("fast path: port", "ifindex", idx, "err", err)
	}
}

// noteFastPathErr keeps the fast path's last error, logged when it changes.
func (d *Dataplane) noteFastPathErr(err error) {
	switch {
	case err == nil && d.fastErr != nil:
		d.log.Info("fast path: working again")
	case err != nil && (d.fastErr == nil || d.fastErr.Error() != err.Error()):
		d.log.Warn("fast path: the kernel forwards routed peers' traffic without it", "err", err)
	}
	d.fastErr = err
}

func (d *Dataplane) fastState() string {
	switch {
	case d.fastErr == nil && d.fast != nil:
		return FastPathOn
	case errors.Is(d.fastErr, fastpath.ErrUnsupported):
		return FastPathUnavailable + ": " + d.fastErr.Error()
	case d.fastErr != nil && d.fast != nil:
		return fmt.Sprintf("%s (partly: %v)", FastPathOn, d.fastErr)
	default:
		return FastPathOff
	}
}

// FastPathPackets is how many packets the fast path has forwarded since
// the dataplane loaded it, and how many of them straight into a
// container's namespace (0 while it is not loaded): for the metric.
func (d *Dataplane) FastPathPackets() (all, intoContainers uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast == nil {
		return 0, 0
	}
	all, into, err := d.fast.path.Redirected()
	if err != nil {
		return 0, 0
	}
	return all, into
}
