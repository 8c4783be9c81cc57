package kernel

// The accept rules in the host's FORWARD chain (package firewall): each
// reconcile keeps them for the VTEP, the bridges and the device of the
// diverted peers (WireGuard's), and the agent removes them when it stops
// (Kernel.RemoveForwardRules).

import (
	"context"
	"errors"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/firewall"
	"github.com/carve-net/carve/internal/ratelog"
	"github.com/carve-net/carve/vxlan"
)

// forwardState is what the reconcile loop knows of the rules; the loop's
// own, and RemoveForwardRules' once the loop has ended.
type forwardState struct {
	last    firewall.Rules // kept by the last Ensure that succeeded
	ok      bool           // that Ensure was the last one
	touched bool           // an Ensure ran in this run: Run removes the rules at its end
	noTools bool           // the host has no iptables, logged once
	errLog  *ratelog.Limiter
}

// keepForwardRules has the rules accept forwarding between this agent's
// devices (diverted: the device of the peers Input.Divert took out, "" none). The kernel is read at every full resync (which repairs a flush
// or a dockerd restart), after a failure and when the devices change; in
// between, nothing is run. A failure is logged and retried, never a
// reconcile error: the routes do not depend on it.
func (k *Kernel) keepForwardRules(ctx context.Context, want *vxlan.Desired, diverted string, network *api.NetworkConfig, full bool) {
	if k.fw == nil {
		return
	}
	devices := []string{want.VTEP.Name}
	for _, b := range want.Bridges {
		devices = append(devices, b.Name)
	}
	if diverted != "" {
		devices = append(devices, diverted)
	}
	slices.Sort(devices)
	rules := firewall.Rules{Devices: devices, IPv6: want.IPv6Forward}
	rules.Underlay, rules.Routed = k.routedForwarding(want, network)
	st := &k.fwState
	if !full && st.ok && st.last.IPv6 == rules.IPv6 && slices.Equal(st.last.Devices, rules.Devices) &&
		st.last.Underlay == rules.Underlay && slices.Equal(st.last.Routed, rules.Routed) {
		return
	}
	st.touched = true
	err := k.fw.Ensure(ctx, rules)
	st.ok, st.last = err == nil, rules
	switch {
	case err == nil:
		st.noTools = false
	case errors.Is(err, firewall.ErrNoIptables):
		if !st.noTools {
			st.noTools = true
			k.log.Warn("forwarding for the overlay depends on the host's FORWARD policy: a DROP policy (dockerd sets one) cuts this host's containers off the other hosts", "err", err)
		}
	default:
		if ok, left := st.errLog.Allow(); ok {
			k.log.Warn("FORWARD accept rules (retried at the next reconcile)", "err", err, "not_logged", left)
		}
	}
}

// routedForwarding is what the FORWARD accept rules need of the routed
// data path: the underlay device, and the overlays' subnets forwarding
// between it and carve's devices is accepted for. Nothing while routed
// mode is off, or while the underlay device cannot be found (then the
// dataplane reports the failure and routes no peer).
func (k *Kernel) routedForwarding(want *vxlan.Desired, network *api.NetworkConfig) (string, []netip.Prefix) {
	if !want.Routed || k.dp == nil {
		return "", nil
	}
	_, dev, err := k.dp.UnderlayMTU(want.VTEP.Local)
	if err != nil {
		return "", nil
	}
	var out []netip.Prefix
	if network != nil {
		for _, ov := range network.Overlays {
			for _, s := range []string{ov.Subnet, ov.Subnet6} {
				if p, err := netip.ParsePrefix(s); err == nil {
					out = append(out, p.Masked())
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return dev, out
}
