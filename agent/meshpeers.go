package agent

// The mesh connections: package meshpeers chooses the peers, the agent
// hands their addresses to the router.

import (
	"context"
	"time"
)

// neighbourer is implemented by routers that tell which peers they are
// connected to directly (gossip.MeshRouter).
type neighbourer interface {
	Neighbours() []string
}

// connectLoop keeps the mesh connections (connectPeers) whenever the
// membership changed (coalesced).
func (a *Agent) connectLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.connectCh:
			a.connectPeers()
		}
	}
}

// connectPeers keeps the router connected to a bounded set of peers
// (Config.MeshPeers, chosen by package meshpeers), and has it forget the
// addresses it no longer needs.
func (a *Agent) connectPeers() {
	peers, known := a.members.MeshPeers(a.id)
	var neighbours []string
	if n, ok := a.router.(neighbourer); ok {
		neighbours = n.Neighbours()
		if neighbours == nil {
			neighbours = []string{} // told: none connected
		}
	}
	connect, forget, chosen := a.meshPeers.Update(peers, known, neighbours, time.Now())
	a.metrics.meshTargets.Set(float64(chosen))
	if len(forget) > 0 {
		a.log.Debug("forgetting mesh peers", "addrs", forget)
		if err := a.router.Forget(forget...); err != nil {
			a.log.Warn("forget mesh peers", "err", err)
		}
	}
	if len(connect) > 0 {
		if err := a.router.Connect(connect...); err != nil {
			a.log.Warn("connect to mesh peers", "err", err)
		}
	}
}
