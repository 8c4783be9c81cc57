package ipam

import (
	"cmp"
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

// ringMessage is the payload of RingChannel.
type ringMessage struct {
	// ClusterID is the sender's masters' cluster ("" when it knows none).
	ClusterID string      `json:"cluster_id,omitempty"`
	Rings     []ringEntry `json:"rings"`
}

// ringData is a ring message as gossip data.
type ringData struct{ msg ringMessage }

// Encode implements gossip.Data.
func (d ringData) Encode() [][]byte {
	b, err := json.Marshal(d.msg)
	if err != nil {
		return nil
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
	out := ringMessage{ClusterID: cmp.Or(o.msg.ClusterID, d.msg.ClusterID)}
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
	return ringData{msg: out}
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
		if e.Family != "4" && e.Family != "6" {
			return ringMessage{}, fmt.Errorf("%w: ring family %q", ErrBadRingMessage, e.Family)
		}
		if err := api.ValidateOverlayName(e.Overlay); err != nil {
			return ringMessage{}, fmt.Errorf("%w: %v", ErrBadRingMessage, err)
		}
	}
	return m, nil
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
		ch.Broadcast(ringData{msg: m})
	}
}

// RingGossip is the handler of RingChannel.
func (s *Service) RingGossip() gossip.Handler { return (*ringHandler)(s) }

// ringHandler receives ring gossip.
type ringHandler Service

// Gossip implements gossip.Handler: every served ring.
func (h *ringHandler) Gossip() gossip.Data {
	m := (*Service)(h).rings()
	if len(m.Rings) == 0 {
		return nil
	}
	return ringData{msg: m}
}

func (h *ringHandler) receive(msg []byte) (gossip.Data, error) {
	s := (*Service)(h)
	m, err := decodeRingMessage(msg)
	if err != nil {
		s.metrics.ringGossip.WithLabelValues(gossipBad).Inc()
		return nil, err
	}
	news, err := s.mergeRings(m)
	switch {
	case errors.Is(err, ErrOtherCluster):
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
	case err != nil:
		s.metrics.ringGossip.WithLabelValues(gossipRefused).Inc()
	}
	if len(news.Rings) == 0 {
		if err == nil {
			s.metrics.ringGossip.WithLabelValues(gossipKnown).Inc()
		}
		return nil, err
	}
	s.metrics.ringGossip.WithLabelValues(gossipNews).Inc()
	return ringData{msg: news}, err
}

// OnGossip implements gossip.Handler.
func (h *ringHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive(msg) }

// OnBroadcast implements gossip.Handler.
func (h *ringHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) { return h.receive(msg) }
