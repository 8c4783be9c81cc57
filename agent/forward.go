package agent

// The accept rules in the host's FORWARD chain (package firewall): the
// reconcile loop keeps them for the VTEP, the bridges and the WireGuard
// device, and Run removes them when the agent stops.

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/carve-net/carve/firewall"
	"github.com/carve-net/carve/internal/ratelog"
	"github.com/carve-net/carve/vxlan"
)

// forwardState is what the reconcile loop knows of the rules; the loop's
// own, and Run's once the loop has ended.
type forwardState struct {
	last    firewall.Rules // kept by the last Ensure that succeeded
	ok      bool           // that Ensure was the last one
	touched bool           // an Ensure ran in this run: Run removes the rules at its end
	noTools bool           // the host has no iptables, logged once
	errLog  *ratelog.Limiter
}

// keepForwardRules has the rules accept forwarding between this agent's
// devices. The kernel is read at every full resync (which repairs a flush
// or a dockerd restart), after a failure and when the devices change; in
// between, nothing is run. A failure is logged and retried, never a
// reconcile error: the routes do not depend on it.
func (a *Agent) keepForwardRules(ctx context.Context, want *vxlan.Desired, enc *encPlan, full bool) {
	if a.fw == nil {
		return
	}
	devices := []string{want.VTEP.Name}
	for _, b := range want.Bridges {
		devices = append(devices, b.Name)
	}
	if enc != nil && enc.mode != "" && a.cfg.NetNS == 0 {
		devices = append(devices, a.wg.cfg.Device)
	}
	slices.Sort(devices)
	rules := firewall.Rules{Devices: devices, IPv6: want.IPv6Forward}
	rules.Underlay, rules.Routed = a.routedForwarding(want)
	st := &a.fwState
	if !full && st.ok && st.last.IPv6 == rules.IPv6 && slices.Equal(st.last.Devices, rules.Devices) &&
		st.last.Underlay == rules.Underlay && slices.Equal(st.last.Routed, rules.Routed) {
		return
	}
	st.touched = true
	err := a.fw.Ensure(ctx, rules)
	st.ok, st.last = err == nil, rules
	switch {
	case err == nil:
		st.noTools = false
	case errors.Is(err, firewall.ErrNoIptables):
		if !st.noTools {
			st.noTools = true
			a.log.Warn("forwarding for the overlay depends on the host's FORWARD policy: a DROP policy (dockerd sets one) cuts this host's containers off the other hosts", "err", err)
		}
	default:
		if ok, left := st.errLog.Allow(); ok {
			a.log.Warn("FORWARD accept rules (retried at the next reconcile)", "err", err, "not_logged", left)
		}
	}
}

// removeForwardRules takes the rules out when the agent stops, if this
// run kept them (a run that never reconciled leaves the firewall alone).
func (a *Agent) removeForwardRules() {
	if a.fw == nil || !a.fwState.touched {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.fw.Remove(ctx); err != nil {
		a.log.Error("remove the FORWARD accept rules", "err", err)
	}
}
