package membership

// The membership gossip handler: deltas (broadcast and relayed gossip),
// digests (periodic gossip) and the unicast messages of anti-entropy. The
// agent runs it with its trust checks; the scale bench runs the same
// handler, so that what it measures is what agents send.

import (
	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/gossip"
)

// Events a Handler counts (HandlerConfig.Count).
const (
	// EventBad: a message that does not decode.
	EventBad = "bad"
	// EventOtherCluster: anti-entropy of another cluster, not answered.
	EventOtherCluster = "other_cluster"
	// EventLegacy: anti-entropy of the protocol before (digest, summary,
	// want of an agent not upgraded yet), ignored.
	EventLegacy = "legacy"
	// EventDigest, EventBuckets, EventPush: anti-entropy messages of each
	// step received (a digest of another agent, bucket hashes, a push
	// naming buckets).
	EventDigest  = "digest"
	EventBuckets = "buckets"
	EventPush    = "push"
)

// HandlerConfig is what a Handler works with.
type HandlerConfig struct {
	// Self is this agent's id, named in its digests.
	Self string
	// Members is the membership gossiped.
	Members *Membership
	// ClusterID returns the cluster this agent is in now ("" before its
	// first master state).
	ClusterID func() string
	// Merge checks and merges a message's records and tombstones and
	// returns what to relay (nil for nothing): the agent admits them
	// against its trust first.
	Merge func(m Message) gossip.Data
	// Unicast sends a message to one peer (the channel's Unicast).
	Unicast func(dst string, msg []byte) error
	// Sent, when set, counts the bytes sent, by kind (delta, digest,
	// buckets, push).
	Sent func(kind string, n int)
	// Count, when set, counts what is received (the Event constants).
	Count func(event string)
	// Debug, when set, logs a failed unicast.
	Debug func(msg string, args ...any)
}

// Handler is the membership channel's gossip.Handler.
type Handler struct{ cfg HandlerConfig }

var _ gossip.Handler = (*Handler)(nil)

// NewHandler returns the handler of a membership channel.
func NewHandler(cfg HandlerConfig) *Handler { return &Handler{cfg: cfg} }

// DigestData is this agent's digest as gossip data.
func (h *Handler) DigestData() gossip.Data {
	return DigestData(h.cfg.ClusterID(), h.cfg.Self, h.cfg.Members.Digest(), h.cfg.Sent)
}

// Gossip implements gossip.Handler: the digest.
func (h *Handler) Gossip() gossip.Data { return h.DigestData() }

// OnGossip implements gossip.Handler.
func (h *Handler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive("", msg) }

// OnBroadcast implements gossip.Handler.
func (h *Handler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return h.receive("", msg)
}

// OnUnicast implements gossip.Handler: anti-entropy's answers; what a push
// brings is merged and not relayed (every peer runs its own anti-entropy).
func (h *Handler) OnUnicast(src string, msg []byte) error {
	_, err := h.receive(src, msg)
	return err
}

func (h *Handler) count(event string) {
	if h.cfg.Count != nil {
		h.cfg.Count(event)
	}
}

// receive handles one message; src is the sender of a unicast ("" for
// broadcast and gossip, where a digest names its sender).
func (h *Handler) receive(src string, data []byte) (gossip.Data, error) {
	m, err := Decode(data)
	if err != nil {
		h.count(EventBad)
		return nil, err
	}
	if m.Legacy {
		h.count(EventLegacy)
	}
	cid := h.cfg.ClusterID()
	ae := m.AE
	if ae != nil && m.ClusterID != cid {
		h.count(EventOtherCluster)
		ae = nil // only messages of this agent's cluster are answered
	}
	if ae != nil && ae.Digest != nil && m.From != h.cfg.Self {
		h.count(EventDigest)
		if b := h.cfg.Members.AnswerDigest(*ae.Digest); b != nil {
			h.unicast(m.From, "buckets", Message{ClusterID: cid, AE: &AntiEntropy{Buckets: b.Encode()}})
		}
	}
	if ae != nil && ae.Buckets != nil && src != "" {
		h.count(EventBuckets)
		if theirs, err := antientropy.DecodeBuckets(ae.Buckets); err == nil {
			h.push(src, cid, h.cfg.Members.AnswerBuckets(theirs))
		}
	}
	var relay gossip.Data
	if len(m.Records)+len(m.Tombstones) > 0 {
		relay = h.cfg.Merge(m)
	}
	if ae != nil && ae.N > 0 && src != "" {
		h.count(EventPush)
		h.push(src, cid, h.cfg.Members.PushBack(m.State, ae.N, ae.Push))
	}
	if src != "" {
		return nil, nil
	}
	return relay, nil
}

// push unicasts pushes, one message each.
func (h *Handler) push(dst, cid string, pushes []Push) {
	for _, p := range pushes {
		msg := Message{ClusterID: cid, State: p.State}
		if p.N > 0 {
			msg.AE = &AntiEntropy{N: p.N, Push: p.Buckets}
		}
		h.unicast(dst, "push", msg)
	}
}

func (h *Handler) unicast(dst, kind string, msg Message) {
	b := Encode(msg)
	if err := h.cfg.Unicast(dst, b); err != nil {
		if h.cfg.Debug != nil {
			h.cfg.Debug("anti-entropy unicast", "to", dst, "kind", kind, "err", err)
		}
		return
	}
	if h.cfg.Sent != nil {
		h.cfg.Sent(kind, len(b))
	}
}
