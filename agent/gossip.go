package agent

// Membership gossip: what the agent sends, and what it does with what it
// hears (package membership's handler, with the agent's trust checks).

import (
	"context"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/gossip"
)

// gossipData is a membership delta as this agent gossips it, with its cluster.
func (a *Agent) gossipData(st membership.State) gossip.Data {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return membership.DeltaData(a.clusterID, st, a.sentCounter(GossipChannel))
}

// digestData is this agent's anti-entropy digest as gossip data.
func (a *Agent) digestData() gossip.Data { return a.membershipHandler().DigestData() }

// membershipHandler is package membership's gossip handler run with this
// agent's trust checks, metrics and channel.
func (a *Agent) membershipHandler() *membership.Handler {
	return membership.NewHandler(membership.HandlerConfig{
		Self:    a.id,
		Members: a.members,
		ClusterID: func() string {
			a.mu.RLock()
			defer a.mu.RUnlock()
			return a.clusterID
		},
		Merge: func(m membership.Message) gossip.Data {
			news, tr, current := a.mergeGossip(m)
			if !current || len(news.Records)+len(news.Tombstones) == 0 {
				return nil
			}
			return membership.DeltaData(tr.ClusterID, news, a.sentCounter(GossipChannel))
		},
		Unicast: func(dst string, msg []byte) error { return a.channel.Unicast(dst, msg) },
		Sent:    a.sentCounter(GossipChannel),
		Count: func(event string) {
			if event == membership.EventBad {
				a.metrics.gossip.WithLabelValues("bad").Inc()
				return
			}
			a.metrics.antiEntropy.WithLabelValues(event).Inc()
		},
		Debug: a.log.Debug,
	})
}

// sentCounter counts the bytes sent on a channel, by kind.
func (a *Agent) sentCounter(channel string) func(kind string, n int) {
	return func(kind string, n int) { a.metrics.gossipSent.WithLabelValues(channel, kind).Add(float64(n)) }
}

// gossipLoop gossips the membership's digest now and then (mesh also
// gossips it periodically, and to every new neighbour), and keeps the
// mesh connections to a bounded set of peers.
func (a *Agent) gossipLoop(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.channel.Gossip(a.digestData())
			a.connectPeers()
			a.metrics.gossipPeers.Set(float64(len(a.router.Peers())))
		}
	}
}

// gossipHandler receives membership gossip: package membership's handler
// (deltas, digests, the unicast messages of anti-entropy) with this
// agent's trust checks (mergeGossip).
type gossipHandler Agent

func (h *gossipHandler) Gossip() gossip.Data { return (*Agent)(h).digestData() }

func (h *gossipHandler) OnGossip(msg []byte) (gossip.Data, error) {
	return (*Agent)(h).membershipHandler().OnGossip(msg)
}

func (h *gossipHandler) OnBroadcast(src string, msg []byte) (gossip.Data, error) {
	return (*Agent)(h).membershipHandler().OnBroadcast(src, msg)
}

func (h *gossipHandler) OnUnicast(src string, msg []byte) error {
	return (*Agent)(h).membershipHandler().OnUnicast(src, msg)
}

// mergeGossip checks and merges the records and tombstones of a message and
// returns what was news; current is false when a rebuild came in between.
func (a *Agent) mergeGossip(m membership.Message) (news membership.State, tr membership.Trust, current bool) {
	a.mu.RLock()
	tr = a.trustLocked()
	floor := a.restoreFloor
	a.mu.RUnlock()
	st, before := dropBeforeRestore(m.State, floor, a.members)
	// Signatures are checked outside the lock; the merge happens under it,
	// only if the cluster and the key are still those checked against, so
	// that a rebuild's reset cannot come between and let old records in.
	in, refused := tr.Admit(m.ClusterID, st, a.members)
	refused = append(refused, before...)
	a.mu.RLock()
	current = a.clusterID == tr.ClusterID && a.signingKey.Equal(tr.Key)
	if current {
		news = a.members.Merge(in)
	}
	a.mu.RUnlock()
	if tr.ClusterID == "" {
		// Agents that start together hear one another before their first
		// master state: counted, but nothing to warn about.
		for _, r := range refused {
			a.metrics.gossipRefused.WithLabelValues(r.Reason).Inc()
			a.log.Debug("refused gossip before the first master state", "reason", r.Reason, "err", r.Err)
		}
	} else {
		a.countRefused(a.metrics.gossipRefused, "gossip", refused)
	}
	switch {
	case !current:
		return news, tr, false // the next gossip is checked against the new cluster or key
	case len(in.Records)+len(in.Tombstones) == 0 && len(refused) > 0:
		a.metrics.gossip.WithLabelValues("refused").Inc()
		return news, tr, true
	case len(news.Records)+len(news.Tombstones) == 0:
		a.metrics.gossip.WithLabelValues("known").Inc()
		return news, tr, true
	}
	a.metrics.gossip.WithLabelValues("news").Inc()
	for _, r := range news.Records {
		if r.ID == a.id {
			continue
		}
		a.log.Debug("learned from gossip", "peer", r.ID, "version", r.Version)
	}
	a.trigger(a.persistCh)
	a.trigger(a.reconcileCh)
	a.trigger(a.connectCh)
	return news, tr, true
}
