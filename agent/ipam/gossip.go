package ipam

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// maxRingMessageBytes bounds one ring message (mesh's own limit is 10 MiB).
const maxRingMessageBytes = 8 << 20

// maxClusterIDLen bounds the cluster id of a ring message.
const maxClusterIDLen = 256

// Errors of received ring gossip, for callers that branch.
var (
	// ErrBadRingMessage marks a ring message that cannot be decoded.
	ErrBadRingMessage = errors.New("bad ring message")
	// ErrOtherCluster marks a ring message of another masters' cluster: its
	// leases carry Raft indexes of another log and are refused whole.
	ErrOtherCluster = errors.New("ring message of another cluster")
)

// ringEntry is one overlay family's ring in a gossip message.
type ringEntry struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Ring    []byte `json:"ring"`
}

// ringMessage is the payload of RingChannel: rings (a broadcast of the
// rings that changed, a relay, an anti-entropy push), or a digest.
//
// Anti-entropy: periodic gossip carries a digest, a hash of every ring the
// sender serves, never the rings. A receiver unicasts to the digest's
// sender the rings whose hash differs from its own; a receiver of such a
// push merges it and, when its merged ring still differs from what it
// received (the pusher lacks something), pushes its ring back. Equal rings
// cost one digest of a few dozen bytes per ring and round.
type ringMessage struct {
	// ClusterID is the sender's masters' cluster ("" when it knows none).
	ClusterID string      `json:"cluster_id,omitempty"`
	Rings     []ringEntry `json:"rings,omitempty"`
	// From and Digest: the sender's anti-entropy digest.
	From   string       `json:"from,omitempty"`
	Digest []ringDigest `json:"digest,omitempty"`
}

// ringDigest is one ring's entry in a digest.
type ringDigest struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hash    uint64 `json:"hash"`
}

// maxDigestRings bounds the rings of a digest (two families per overlay).
const maxDigestRings = 1024

type ringID struct{ overlay, family string }

// ringHash is a ring's hash, valid while its change count is changes.
type ringHash struct {
	changes uint64
	hash    uint64
}

// ringData is a ring message as gossip data.
type ringData struct {
	msg ringMessage
	// sent, when set, counts the bytes of every encoding.
	sent func(kind string, n int)
}

// Encode implements gossip.Data.
func (d ringData) Encode() [][]byte {
	b, err := json.Marshal(d.msg)
	if err != nil {
		return nil
	}
	if d.sent != nil {
		kind := "delta"
		if d.msg.Digest != nil {
			kind = "digest"
		}
		d.sent(kind, len(b))
	}
	return [][]byte{b}
}

// Merge implements gossip.Data as a join: one ring per (overlay, family),
// two rings of one key joined by the ring CRDT's own merge, so that pending
// sends on a slow link never pile up copies. Data of two cluster ids has no
// join: the other (the newer, as mesh merges pending data with new data)
// wins, since the older cluster's rings are worthless to every receiver.
func (d ringData) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(ringData)
	if !ok {
		return d
	}
	if d.msg.ClusterID != "" && o.msg.ClusterID != "" && d.msg.ClusterID != o.msg.ClusterID {
		return o
	}
	out := ringMessage{ClusterID: cmp.Or(o.msg.ClusterID, d.msg.ClusterID), From: o.msg.From, Digest: o.msg.Digest}
	if out.Digest == nil {
		out.From, out.Digest = d.msg.From, d.msg.Digest
	}
	at := map[[2]string]int{}
	for _, e := range slices.Concat(d.msg.Rings, o.msg.Rings) {
		k := [2]string{e.Overlay, e.Family}
		if i, dup := at[k]; dup {
			out.Rings[i].Ring = joinRings(out.Rings[i].Ring, e.Ring)
			continue
		}
		at[k] = len(out.Rings)
		out.Rings = append(out.Rings, e)
	}
	sent := o.sent
	if sent == nil {
		sent = d.sent
	}
	return ringData{msg: out, sent: sent}
}

// joinRings is the CRDT merge of two encoded rings. An encoding that does
// not decode is dropped for the valid one; two valid rings without a join
// (other universes, overlapping leases) keep the newer, b.
func joinRings(a, b []byte) []byte {
	ra, errA := ring.Decode(a)
	rb, errB := ring.Decode(b)
	switch {
	case errA != nil:
		return b
	case errB != nil:
		return a
	}
	if _, err := ra.Merge(rb); err != nil {
		return b
	}
	return ra.Encode()
}

// decodeRingMessage decodes a ring message from the network; each ring is
// validated by ring.Decode when merged.
func decodeRingMessage(b []byte) (ringMessage, error) {
	var m ringMessage
	if len(b) > maxRingMessageBytes {
		return ringMessage{}, fmt.Errorf("%w: %d bytes", ErrBadRingMessage, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return ringMessage{}, fmt.Errorf("%w: %v", ErrBadRingMessage, err)
	}
	if len(m.ClusterID) > maxClusterIDLen {
		return ringMessage{}, fmt.Errorf("%w: cluster id of %d bytes", ErrBadRingMessage, len(m.ClusterID))
	}
	for _, e := range m.Rings {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: ring: %v", ErrBadRingMessage, err)
		}
	}
	if m.Digest != nil {
		if err := api.ValidateAgentID(m.From); err != nil {
			return ringMessage{}, fmt.Errorf("%w: digest sender: %v", ErrBadRingMessage, err)
		}
		if len(m.Digest) > maxDigestRings {
			return ringMessage{}, fmt.Errorf("%w: digest of %d rings", ErrBadRingMessage, len(m.Digest))
		}
	}
	for _, e := range m.Digest {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: digest: %v", ErrBadRingMessage, err)
		}
	}
	return m, nil
}

// validRingKey checks the overlay and family that name a ring.
func validRingKey(overlay, family string) error {
	if family != "4" && family != "6" {
		return fmt.Errorf("family %q", family)
	}
	return api.ValidateOverlayName(overlay)
}

// allocatorOf returns a served overlay's allocator of a family ("4", "6");
// the caller holds s.mu.
func (s *Service) allocatorOf(overlay, family string) *ring.Allocator {
	o := s.overlays[overlay]
	if o == nil || o.unserved != "" {
		return nil
	}
	if family == "6" {
		return o.alloc[1]
	}
	return o.alloc[0]
}

// rings returns every ring this agent serves, with fresh free counts.
func (s *Service) rings() ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := ringMessage{ClusterID: s.clusterID}
	for _, name := range sortedKeys(s.overlays) {
		for fam := range families {
			a := s.allocatorOf(name, familyName(fam))
			if a == nil {
				continue
			}
			if _, err := a.SyncFree(); err != nil {
				s.log.Warn("ring free counts", "overlay", name, "err", err)
			}
			m.Rings = append(m.Rings, ringEntry{Overlay: name, Family: familyName(fam), Ring: a.EncodeRing()})
		}
	}
	return m
}

// Rings returns the encoding of every ring this agent serves, by
// "<overlay>/<family>".
func (s *Service) Rings() map[string][]byte {
	out := map[string][]byte{}
	for _, e := range s.rings().Rings {
		out[e.Overlay+"/"+e.Family] = e.Ring
	}
	return out
}

// mergeRings merges remote rings, makes the changed ones durable, and
// returns them (to relay). A remote change that would take a range holding
// allocations is refused by the allocator (ring.TakeoverError) and the ring
// stays as it was; so does a message of another cluster (ErrOtherCluster).
func (s *Service) mergeRings(m ringMessage) (ringMessage, error) {
	news, b, err := s.decideMerge(m)
	if b != nil {
		if ferr := s.flush(b); ferr != nil {
			err = errors.Join(err, fmt.Errorf("persist rings: %w", ferr))
		}
	}
	if len(news.Rings) > 0 {
		s.changed()
	}
	return news, err
}

func (s *Service) decideMerge(m ringMessage) (ringMessage, *batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	news := ringMessage{ClusterID: s.clusterID}
	if s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID {
		return news, nil, fmt.Errorf("%w: %q, this agent's is %q", ErrOtherCluster, m.ClusterID, s.clusterID)
	}
	var b *batch
	var errs []error
	for _, e := range m.Rings {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue // an overlay this agent does not serve (yet)
		}
		changed, err := a.MergeEncoded(e.Ring)
		if err != nil {
			var te *ring.TakeoverError
			if errors.As(err, &te) {
				s.log.Warn("refused a ring change that takes addresses in use", "overlay", e.Overlay, "family", e.Family, "err", err)
			}
			errs = append(errs, fmt.Errorf("ring %s/%s: %w", e.Overlay, e.Family, err))
			continue
		}
		if !changed {
			continue
		}
		enc := a.EncodeRing()
		fam := 0
		if e.Family == "6" {
			fam = 1
		}
		o := s.overlays[e.Overlay]
		writes, adopted := s.syncBlocks(o, fam)
		b = s.enqueue(change{writes: append([]write{putRing(e.Overlay, fam, enc)}, writes...)})
		if adopted {
			// A grant, or one this agent held before it lost its data dir:
			// take back the addresses its containers hold there first.
			s.claimPersisted(o, slog.LevelDebug)
			s.reclaimFromCNICache(o, func(c change) { b = s.enqueue(c) })
		}
		news.Rings = append(news.Rings, ringEntry{Overlay: e.Overlay, Family: e.Family, Ring: enc})
	}
	return news, b, errors.Join(errs...)
}

// broadcast sends changed rings on the ring channel.
func (s *Service) broadcast(m ringMessage) {
	if len(m.Rings) == 0 {
		return
	}
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch != nil {
		ch.Broadcast(ringData{msg: m, sent: s.onSent})
	}
}

// ringDigestLocked hashes every served ring (with fresh free counts),
// again only for rings that changed since; s.mu is held.
func (s *Service) ringDigestLocked() []ringDigest {
	var out []ringDigest
	for _, name := range sortedKeys(s.overlays) {
		for fam := range families {
			a := s.allocatorOf(name, familyName(fam))
			if a == nil {
				continue
			}
			if _, err := a.SyncFree(); err != nil {
				s.log.Warn("ring free counts", "overlay", name, "err", err)
			}
			k := ringID{name, familyName(fam)}
			h, ok := s.ringHashes[k]
			if !ok || h.changes != a.RingChanges() {
				sum := sha256.Sum256(a.EncodeRing())
				h = ringHash{changes: a.RingChanges(), hash: binary.BigEndian.Uint64(sum[:8])}
				s.ringHashes[k] = h
			}
			out = append(out, ringDigest{Overlay: name, Family: familyName(fam), Hash: h.hash})
		}
	}
	return out
}

// answerDigest returns the served rings whose hash differs from the
// digest's (or that it lacks): what to push to its sender.
func (s *Service) answerDigest(m ringMessage) ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ringMessage{ClusterID: s.clusterID}
	theirs := map[ringID]uint64{}
	for _, e := range m.Digest {
		theirs[ringID{e.Overlay, e.Family}] = e.Hash
	}
	for _, mine := range s.ringDigestLocked() {
		k := ringID{mine.Overlay, mine.Family}
		if h, ok := theirs[k]; ok && h == mine.Hash {
			continue
		}
		a := s.allocatorOf(mine.Overlay, mine.Family)
		out.Rings = append(out.Rings, ringEntry{Overlay: mine.Overlay, Family: mine.Family, Ring: a.EncodeRing()})
	}
	return out
}

// pushBack returns, of the rings a peer pushed, this agent's rings that
// still differ from them after the merge: the pusher lacks something.
func (s *Service) pushBack(pushed ringMessage) ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ringMessage{ClusterID: s.clusterID}
	for _, e := range pushed.Rings {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue
		}
		if enc := a.EncodeRing(); !bytes.Equal(enc, e.Ring) {
			out.Rings = append(out.Rings, ringEntry{Overlay: e.Overlay, Family: e.Family, Ring: enc})
		}
	}
	return out
}

// unicast sends a ring message to one peer.
func (s *Service) unicast(dst, kind string, m ringMessage) {
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch == nil {
		return
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	if err := ch.Unicast(dst, b); err != nil {
		s.log.Debug("ring anti-entropy unicast", "to", dst, "err", err)
		return
	}
	if s.onSent != nil {
		s.onSent(kind, len(b))
	}
}

// RingGossip is the handler of RingChannel.
func (s *Service) RingGossip() gossip.Handler { return (*ringHandler)(s) }

// ringHandler receives ring gossip.
type ringHandler Service

// Gossip implements gossip.Handler: the digest of the served rings.
func (h *ringHandler) Gossip() gossip.Data {
	s := (*Service)(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.ringDigestLocked()
	if len(d) == 0 {
		return nil
	}
	return ringData{msg: ringMessage{ClusterID: s.clusterID, From: s.id, Digest: d}, sent: s.onSent}
}

// receive handles a ring message; src is the sender of a unicast ("" for
// broadcast and gossip).
func (h *ringHandler) receive(src string, msg []byte) (gossip.Data, error) {
	s := (*Service)(h)
	m, err := decodeRingMessage(msg)
	if err != nil {
		s.metrics.ringGossip.WithLabelValues(gossipBad).Inc()
		return nil, err
	}
	if m.Digest != nil && m.From != s.id {
		s.mu.Lock()
		other := s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID
		s.mu.Unlock()
		if other {
			s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
			return nil, fmt.Errorf("%w: %q", ErrOtherCluster, m.ClusterID)
		}
		if push := s.answerDigest(m); len(push.Rings) > 0 {
			s.unicast(m.From, "push", push)
		}
	}
	if len(m.Rings) == 0 {
		return nil, nil
	}
	news, err := s.mergeRings(m)
	switch {
	case errors.Is(err, ErrOtherCluster):
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
	case err != nil:
		s.metrics.ringGossip.WithLabelValues(gossipRefused).Inc()
	}
	if src != "" && err == nil {
		if back := s.pushBack(m); len(back.Rings) > 0 {
			s.unicast(src, "push", back)
		}
	}
	if len(news.Rings) == 0 {
		if err == nil {
			s.metrics.ringGossip.WithLabelValues(gossipKnown).Inc()
		}
		return nil, err
	}
	s.metrics.ringGossip.WithLabelValues(gossipNews).Inc()
	return ringData{msg: news, sent: s.onSent}, err
}

// OnGossip implements gossip.Handler.
func (h *ringHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive("", msg) }

// OnBroadcast implements gossip.Handler.
func (h *ringHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return h.receive("", msg)
}

// OnUnicast implements gossip.Handler. Two kinds of message travel by
// unicast on the ring channel: space requests and their answers (growth,
// spacemsg.go), which always carry a "kind", and anti-entropy pushes,
// which never do (merged and not relayed).
func (h *ringHandler) OnUnicast(src string, msg []byte) error {
	if isSpaceMessage(msg) {
		return h.onSpaceMessage(src, msg)
	}
	_, err := h.receive(src, msg)
	return err
}

// isSpaceMessage tells a space message from a ring message by its
// top-level "kind" key; the decoders check everything else.
func isSpaceMessage(msg []byte) bool {
	if len(msg) > maxRingMessageBytes {
		return false
	}
	var probe struct {
		Kind *string `json:"kind"`
	}
	return json.Unmarshal(msg, &probe) == nil && probe.Kind != nil
}
