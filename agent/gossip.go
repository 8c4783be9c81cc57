package agent

// Membership gossip: what the agent sends, and what it does with what it
// hears (deltas, digests and the anti-entropy answers of package membership).

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
func (a *Agent) digestData() gossip.Data {
	a.mu.RLock()
	cid := a.clusterID
	a.mu.RUnlock()
	return membership.DigestData(cid, a.id, a.members.Digest(0), a.sentCounter(GossipChannel))
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

// gossipHandler receives membership gossip: deltas (broadcast and relayed
// gossip), digests (periodic gossip), and the unicast answers of
// anti-entropy (see package membership).
type gossipHandler Agent

func (h *gossipHandler) Gossip() gossip.Data { return (*Agent)(h).digestData() }

// receive handles one message; src is the sender of a unicast ("" for
// broadcast and gossip, where a digest names its sender).
func (h *gossipHandler) receive(src string, msg []byte) (gossip.Data, error) {
	a := (*Agent)(h)
	m, err := membership.Decode(msg)
	if err != nil {
		a.metrics.gossip.WithLabelValues("bad").Inc()
		return nil, err
	}
	a.answer(src, &m)
	if len(m.Records)+len(m.Tombstones) == 0 {
		return nil, nil
	}
	news, tr, current := a.mergeGossip(m)
	if !current || len(news.Records)+len(news.Tombstones) == 0 {
		return nil, nil
	}
	return membership.DeltaData(tr.ClusterID, news, a.sentCounter(GossipChannel)), nil
}

// mergeGossip checks and merges the records and tombstones of a message and
// returns what was news; current is false when a rebuild came in between.
func (a *Agent) mergeGossip(m membership.Message) (news membership.State, tr membership.Trust, current bool) {
	a.mu.RLock()
	tr = a.trustLocked()
	a.mu.RUnlock()
	// Signatures are checked outside the lock; the merge happens under it,
	// only if the cluster and the key are still those checked against, so
	// that a rebuild's reset cannot come between and let old records in.
	in, refused := tr.Admit(m.ClusterID, m.State, a.members)
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

// answer handles the anti-entropy parts of a message: a digest is answered
// with a summary of the buckets that differ, a summary with a push of what
// the other lacks and a want list, a want list with a push. Only messages
// of this agent's cluster are answered.
func (a *Agent) answer(src string, m *membership.Message) {
	if m.Digest == nil && m.Summary == nil && len(m.Want) == 0 {
		return
	}
	a.mu.RLock()
	cid := a.clusterID
	a.mu.RUnlock()
	if m.ClusterID != cid {
		a.metrics.antiEntropy.WithLabelValues("other_cluster").Inc()
		return
	}
	if m.Digest != nil && m.From != a.id {
		a.metrics.antiEntropy.WithLabelValues("digest").Inc()
		if sum := a.members.AnswerDigest(m.Digest); sum != nil {
			a.unicast(m.From, "summary", membership.Message{ClusterID: cid, Summary: sum})
		}
	}
	if src == "" {
		return // summaries and want lists come by unicast only
	}
	if m.Summary != nil {
		a.metrics.antiEntropy.WithLabelValues("summary").Inc()
		push, want := a.members.AnswerSummary(m.Summary)
		a.push(src, cid, push)
		if len(want) > 0 {
			a.unicast(src, "want", membership.Message{ClusterID: cid, Want: want})
		}
	}
	if len(m.Want) > 0 {
		a.metrics.antiEntropy.WithLabelValues("want").Inc()
		a.push(src, cid, a.members.Lookup(m.Want))
	}
}

// push unicasts records and tombstones, in bounded messages.
func (a *Agent) push(dst, cid string, st membership.State) {
	for _, c := range membership.Chunks(st) {
		a.unicast(dst, "push", membership.Message{ClusterID: cid, State: c})
	}
}

func (a *Agent) unicast(dst, kind string, msg membership.Message) {
	b := membership.Encode(msg)
	if err := a.channel.Unicast(dst, b); err != nil {
		a.log.Debug("anti-entropy unicast", "to", dst, "kind", kind, "err", err)
		return
	}
	a.metrics.gossipSent.WithLabelValues(GossipChannel, kind).Add(float64(len(b)))
}

func (h *gossipHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive("", msg) }

func (h *gossipHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return h.receive("", msg)
}

// OnUnicast receives anti-entropy answers; what a push brings is merged
// and not relayed (every peer runs its own anti-entropy).
func (h *gossipHandler) OnUnicast(src string, msg []byte) error {
	_, err := h.receive(src, msg)
	return err
}
