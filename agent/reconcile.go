package agent

// The reconcile loop: what the agent hands package kernel, and what it
// does around it (the IPAM's view, the conflists, the Docker plugin,
// encryption, the report to the masters).

import (
	"context"
	"errors"
	"time"

	"github.com/carve-net/carve/agent/encryption"
	"github.com/carve-net/carve/agent/kernel"
	"github.com/carve-net/carve/vxlan"
)

// reconcileLoop programs the kernel: the difference on every change, and a
// full read-back resync every ResyncInterval (which repairs changes made by
// hand), or less often where a resync takes long (resyncEvery). A failed
// reconcile is retried soon.
func (a *Agent) reconcileLoop(ctx context.Context) {
	// Before the first conflist is written, and off the paths that serve
	// the IPAM socket: the plugin probe takes a moment.
	a.chooseCNIVersion(ctx)
	resync := time.NewTicker(a.cfg.ResyncInterval)
	defer resync.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		full := false
		select {
		case <-ctx.Done():
			return
		case <-a.reconcileCh:
		case <-retry.C:
		case <-resync.C:
			full = true
		}
		start := time.Now()
		if err := a.reconcile(ctx, full); err != nil {
			a.log.Warn("reconcile", "err", err, "full", full)
			retry.Reset(2 * time.Second)
		}
		if full {
			resync.Reset(resyncEvery(a.cfg.ResyncInterval, time.Since(start)))
		}
	}
}

// resyncCost is the most of its time an idle agent spends in full
// resyncs: one in 200 (0.5% of a core).
const resyncCost = 200

// resyncEvery is the wait until the next full resync after one that took
// took: every (the --resync-interval), or resyncCost times took where that
// is longer. A resync reads back and recomputes every peer's entries, so
// its cost grows with the peers: about a second at 50,000, where one every
// 30 s made the idle agent's CPU 1.7 s a minute; it runs every few minutes
// there, and changes made by hand are repaired that much later.
func resyncEvery(every, took time.Duration) time.Duration {
	return max(every, took*resyncCost)
}

// reconcile computes the desired dataplane and applies it. While the agent
// refuses the masters' records, the saved records it no longer verifies
// are kept in what it programs (verify.go, withUnverified): the kernel
// holds them from when they verified, and an agent that dropped them would
// remove every peer it cannot verify now.
func (a *Agent) reconcile(ctx context.Context, full bool) error {
	a.mu.RLock()
	self, network, cluster, merged, unverified := a.self, a.network, a.clusterID, a.mergedIndex, a.unverified
	a.mu.RUnlock()
	if self == nil {
		return nil // never registered and nothing persisted: nothing to program yet
	}
	members := withUnverified(a.members.State(), unverified)
	network = a.kernel.WithMTUs(network, members.Records)
	a.ipam.Sync(ipamView(cluster, self, network, members, merged))
	// The kernel and the conflists leave out the disabled overlays no
	// container of this host is attached to any more.
	selfHere, drained := a.kernel.Drain(self, network, a.attachedHere)
	a.writeConflists(selfHere, network)
	if a.docker != nil {
		a.docker.Sync()
	}
	if len(selfHere.Overlays) == 0 && len(self.Overlays) > 0 {
		// Every overlay of this agent is disabled and drained: the VTEP
		// and bridges stay as they are (docs/operations.md, section 7b).
		return nil
	}
	var enc *encryption.Plan
	res, err := a.kernel.Reconcile(ctx, kernel.Input{Self: selfHere, Network: network, Members: members, Drained: drained,
		Index: merged, Growth: a.ipam, Full: full,
		// Takes the encrypted peers out of VXLAN; the FORWARD accept rules
		// cover the WireGuard device of the agent's own namespace.
		Divert: func(want *vxlan.Desired) string {
			enc = a.wg.Plan(self, network, members, want)
			if enc.Mode() != "" && a.cfg.NetNS == 0 {
				return a.wg.Device()
			}
			return ""
		}})
	a.noteReconciled(self)
	if res.Report == nil {
		return err // nothing reached the kernel
	}
	// After VXLAN: the routes through WireGuard use the VTEP's address.
	return errors.Join(err, a.wg.Apply(ctx, enc, a.cfg.NetNS > 0)) // the dataplane logs what it changed
}

// attachedHere counts the attachments of a network on this host.
func (a *Agent) attachedHere(network string) int {
	return len(a.ipam.List(network).Allocations)
}
