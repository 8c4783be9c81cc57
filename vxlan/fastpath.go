package vxlan

import (
	"errors"
	"fmt"
	"net/netip"

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

// syncFastPath points the fast path at what this reconcile programmed: the
// routed peers' IPv4 routes (desired entries whose device is the underlay)
// and the IPv4 blocks of the bridges in place. It never fails the
// reconcile: without the shortcut the kernel forwards the same packets the
// same way, only slower. u is nil when routed mode is off.
func (d *Dataplane) syncFastPath(u *underlay, desired *entrySet, bridges map[string]Bridge, full bool, rep *Report) {
	want := map[netip.Prefix]fastpath.Target{}
	if u != nil && !d.noFastPath {
		for k, r := range desired.route {
			if r.oif == u.index && k.dst.Addr().Is4() {
				want[k.dst.Masked()] = fastpath.Target{Ifindex: u.index, Kind: fastpath.KindPeer}
			}
		}
	}
	if len(want) == 0 { // nothing routed: nothing to shortcut
		if d.fast != nil {
			if err := d.inNS(d.fast.Close); err != nil {
				d.log.Warn("fast path: detach", "err", err)
			}
			d.fast = nil
		}
		if u != nil {
			rep.FastPath = FastPathOff
		}
		return
	}
	for _, b := range bridges {
		l, err := d.h.LinkByName(b.Name)
		if err != nil {
			continue // reported by the bridges' reconcile; retried with it
		}
		for _, a := range b.addresses() {
			if a.Addr().Is4() {
				want[a.Masked()] = fastpath.Target{Ifindex: l.Attrs().Index, Kind: fastpath.KindLocal}
			}
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
		d.fast, full = p, true
	}
	err := d.inNS(func() error { return d.fast.Sync(want, full) })
	d.noteFastPathErr(err)
	rep.FastPath = d.fastState()
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
// the dataplane loaded it (0 while it is not loaded): for the metric.
func (d *Dataplane) FastPathPackets() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast == nil {
		return 0
	}
	n, err := d.fast.Redirected()
	if err != nil {
		return 0
	}
	return n
}
