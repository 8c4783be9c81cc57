package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// RingChannel is the mesh channel that carries every overlay's rings. One
// channel for all of them, because mesh channels must be registered before
// the router starts, and an agent learns its overlays only later.
const RingChannel = "carve-rings"

// maxRingGossipBytes bounds one ring message.
const maxRingGossipBytes = 8 << 20

// ringEntry is one overlay family's ring in a gossip message.
type ringEntry struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Ring    []byte `json:"ring"`
}

type ringMessage struct {
	Rings []ringEntry `json:"rings"`
}

// ringData is a set of rings as gossip data; merging two is their union
// (each receiver merges every ring, so keeping both is a join).
type ringData struct{ msg ringMessage }

func (d ringData) Encode() [][]byte {
	b, err := json.Marshal(d.msg)
	if err != nil {
		return nil
	}
	return [][]byte{b}
}

func (d ringData) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(ringData)
	if !ok {
		return d
	}
	out := ringMessage{Rings: slices.Clone(d.msg.Rings)}
	for _, e := range o.msg.Rings {
		if !slices.ContainsFunc(out.Rings, func(x ringEntry) bool {
			return x.Overlay == e.Overlay && x.Family == e.Family && bytes.Equal(x.Ring, e.Ring)
		}) {
			out.Rings = append(out.Rings, e)
		}
	}
	return ringData{msg: out}
}

// decodeRingMessage decodes a ring message from the network; each ring is
// validated by ring.Decode when merged.
func decodeRingMessage(b []byte) (ringMessage, error) {
	var m ringMessage
	if len(b) > maxRingGossipBytes {
		return m, fmt.Errorf("%w: ring message of %d bytes", ErrBadGossip, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: %v", ErrBadGossip, err)
	}
	for _, e := range m.Rings {
		if e.Family != "4" && e.Family != "6" {
			return m, fmt.Errorf("%w: ring family %q", ErrBadGossip, e.Family)
		}
	}
	return m, nil
}

// allocatorOf returns an overlay family's allocator; the caller holds s.mu.
func (s *IPAM) allocatorOf(overlay, family string) *ring.Allocator {
	o := s.overlays[overlay]
	if o == nil {
		return nil
	}
	if family == "6" {
		return o.alloc6
	}
	return o.alloc4
}

// rings returns every ring this agent holds, with fresh free counts.
func (s *IPAM) rings() ringMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m ringMessage
	for _, name := range sortedKeys(s.overlays) {
		for _, fam := range []string{"4", "6"} {
			a := s.allocatorOf(name, fam)
			if a == nil {
				continue
			}
			if _, err := a.SyncFree(); err != nil {
				s.log.Warn("ring free counts", "overlay", name, "err", err)
			}
			m.Rings = append(m.Rings, ringEntry{Overlay: name, Family: fam, Ring: a.EncodeRing()})
		}
	}
	return m
}

// mergeRings merges remote rings and returns this agent's rings that changed
// (to relay). A remote change that would take a range holding allocations
// is refused by the allocator (ring.TakeoverError) and logged; the ring
// stays as it was.
func (s *IPAM) mergeRings(m ringMessage) (ringMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var news ringMessage
	var errs []error
	for _, e := range m.Rings {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue // an overlay this agent does not have (yet)
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
		if err := s.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(ipamRingBucket)).Put([]byte(e.Overlay+"/"+e.Family), enc)
		}); err != nil {
			errs = append(errs, fmt.Errorf("persist ring %s/%s: %w", e.Overlay, e.Family, err))
		}
		news.Rings = append(news.Rings, ringEntry{Overlay: e.Overlay, Family: e.Family, Ring: enc})
	}
	return news, errors.Join(errs...)
}

// ringHandler receives ring gossip.
type ringHandler Agent

func (h *ringHandler) Gossip() gossip.Data {
	m := (*Agent)(h).ipam.rings()
	if len(m.Rings) == 0 {
		return nil
	}
	return ringData{msg: m}
}

func (h *ringHandler) merge(msg []byte) (gossip.Data, error) {
	a := (*Agent)(h)
	m, err := decodeRingMessage(msg)
	if err != nil {
		a.metrics.gossip.WithLabelValues("bad").Inc()
		return nil, err
	}
	news, err := a.ipam.mergeRings(m)
	if len(news.Rings) == 0 {
		return nil, err
	}
	return ringData{msg: news}, err
}

func (h *ringHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.merge(msg) }

func (h *ringHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) { return h.merge(msg) }

func (h *ringHandler) OnUnicast(src string, _ []byte) error {
	return fmt.Errorf("unexpected unicast from %s on %s", src, RingChannel)
}
