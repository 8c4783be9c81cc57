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
// hand), or less often with tens of thousands of peers (resyncEvery). A
// failed reconcile is retried soon.
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
		if err := a.reconcile(ctx, full); err != nil {
			a.log.Warn("reconcile", "err", err, "full", full)
			retry.Reset(2 * time.Second)
		}
		if full {
			resync.Reset(resyncEvery(a.cfg.ResyncInterval, a.members.Len()))
		}
	}
}

// resyncPerPeer is how far apart full resyncs are at the least, per peer.
// A resync reads back and recomputes every peer's entries: about 20 µs of
// CPU a peer (a second at 50,000, where one every 30 s made the idle
// agent's CPU 1.7 s a minute); 200 times that keeps resyncs to 0.5% of a
// core. It counts peers, not the last resync's time, so that a loaded host
// (or a test under the race detector) keeps its interval.
const resyncPerPeer = 4 * time.Millisecond

// resyncEvery is the wait until the next full resync with peers peers:
// every (the --resync-interval), or resyncPerPeer a peer where that is
// longer (beyond 7,500 peers at the default 30 s: every 200 s at 50,000,
// and changes made by hand are repaired that much later).
func resyncEvery(every time.Duration, peers int) time.Duration {
	return max(every, time.Duration(peers)*resyncPerPeer)
}

// reconcile computes the desired dataplane and applies it. While the agent
// refuses the masters' records, the saved records it no longer verifies
// are kept in what it programs (verify.go, withUnverified): the kernel
// holds them from when they verified, and an agent that dropped them would
// remove every peer it cannot verify now.
func (a *Agent) reconcile(ctx context.Context, full bool) error {
	a.mu.RLock()
	self, network, cluster, merged, epoch, unverified := a.self, a.network, a.clusterID, a.mergedIndex, a.restoreEpoch, a.unverified
	a.mu.RUnlock()
	if self == nil {
		return nil // never registered and nothing persisted: nothing to program yet
	}
	members := withUnverified(a.members.State(), unverified)
	network = a.kernel.WithMTUs(network, members.Records)
	a.ipam.Sync(ipamView(cluster, self, network, members, merged, epoch))
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
