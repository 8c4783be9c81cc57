package ipamwire

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// RingEntry is one overlay family's ring, or part of it, in a ring
// message: any subset of a ring's entries is a valid ring that joins as
// the whole would (ring.Ring.Delta).
type RingEntry struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	// Ring is the ring's encoding (ring.Ring.Encode), checked by
	// ring.Decode when merged.
	Ring []byte `json:"ring"`
	// N and Buckets, when set, say that Ring holds the sender's entries of
	// these buckets (of N) and ask the receiver for its own entries of the
	// buckets where they still differ after the merge.
	N       int   `json:"n,omitempty"`
	Buckets []int `json:"buckets,omitempty"`
}

// RingBuckets is one ring's bucket hashes (antientropy.Buckets.Encode): 8
// bytes a bucket, big-endian, a power of two of buckets.
type RingBuckets struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hashes  []byte `json:"hashes"`
}

// RingDigest is one ring's entry in a digest.
type RingDigest struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hash    uint64 `json:"hash"`
}

// RingMessage is a message of the ring channel that is not a space
// message (it has no "kind").
//
// Changes travel as deltas: a broadcast carries only the entries of each
// ring that the other agents do not hold yet (what a grant, a return or a
// free-count update wrote), and each receiver relays only what was news to
// it. What the masters' leases change is never broadcast: every agent
// seeds it into its rings from its own view of the masters.
//
// Anti-entropy, for what a broadcast missed, never sends a whole ring: it
// is package antientropy's protocol over each ring's entries, keyed by
// owner:
//
//  1. Periodic gossip carries a digest: the digest of every ring the
//     sender serves (antientropy.Digest).
//  2. A receiver whose ring's digest differs unicasts back that ring's
//     bucket hashes (Buckets).
//  3. The digest's sender unicasts its entries of the buckets that differ,
//     naming them (RingEntry.N and Buckets).
//  4. The receiver merges them and, where its entries of those buckets
//     still differ from what it received, unicasts its own back.
type RingMessage struct {
	// ClusterID is the sender's masters' cluster ("" when it knows none).
	ClusterID string      `json:"cluster_id,omitempty"`
	Rings     []RingEntry `json:"rings,omitempty"`
	// From and Digest: the sender's anti-entropy digest.
	From   string       `json:"from,omitempty"`
	Digest []RingDigest `json:"digest,omitempty"`
	// Buckets answers a digest (by unicast): the bucket hashes of the
	// rings whose digest hash differs.
	Buckets []RingBuckets `json:"buckets,omitempty"`
}

// Kind names what a ring message carries, for counting bytes sent: a
// "digest" when it has one, else a "delta".
func (m RingMessage) Kind() string {
	if m.Digest != nil {
		return "digest"
	}
	return "delta"
}

// EncodeRingMessage is a ring message's wire bytes.
func EncodeRingMessage(m RingMessage) []byte {
	b, _ := json.Marshal(m) // strings, numbers and bytes: cannot fail
	return b
}

// DecodeRingMessage decodes a ring message from the network and checks
// everything but the rings themselves, which ring.Decode checks when they
// are merged. The error wraps ErrBadRingMessage.
func DecodeRingMessage(b []byte) (RingMessage, error) {
	var m RingMessage
	if len(b) > MaxMessageBytes {
		return RingMessage{}, fmt.Errorf("%w: %d bytes", ErrBadRingMessage, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return RingMessage{}, fmt.Errorf("%w: %v", ErrBadRingMessage, err)
	}
	if err := m.check(); err != nil {
		return RingMessage{}, fmt.Errorf("%w: %v", ErrBadRingMessage, err)
	}
	return m, nil
}

func (m *RingMessage) check() error {
	if len(m.ClusterID) > MaxClusterIDLen {
		return fmt.Errorf("cluster id of %d bytes", len(m.ClusterID))
	}
	for _, e := range m.Rings {
		if err := ValidRingKey(e.Overlay, e.Family); err != nil {
			return fmt.Errorf("ring: %v", err)
		}
	}
	if m.Digest != nil {
		if err := api.ValidateAgentID(m.From); err != nil {
			return fmt.Errorf("digest sender: %v", err)
		}
		if len(m.Digest) > MaxDigestRings {
			return fmt.Errorf("digest of %d rings", len(m.Digest))
		}
	}
	for _, e := range m.Digest {
		if err := ValidRingKey(e.Overlay, e.Family); err != nil {
			return fmt.Errorf("digest: %v", err)
		}
	}
	for _, e := range m.Rings {
		if e.N == 0 && e.Buckets == nil {
			continue
		}
		if len(e.Buckets) == 0 {
			return fmt.Errorf("ring %s/%s: a push naming no bucket of %d", e.Overlay, e.Family, e.N)
		}
		if err := antientropy.ValidBuckets(e.N, e.Buckets); err != nil {
			return fmt.Errorf("ring %s/%s: %v", e.Overlay, e.Family, err)
		}
	}
	if len(m.Buckets) > MaxDigestRings {
		return fmt.Errorf("bucket hashes of %d rings", len(m.Buckets))
	}
	for _, e := range m.Buckets {
		if err := ValidRingKey(e.Overlay, e.Family); err != nil {
			return fmt.Errorf("bucket hashes: %v", err)
		}
		if _, err := antientropy.DecodeBuckets(e.Hashes); err != nil {
			return fmt.Errorf("bucket hashes: %v", err)
		}
	}
	return nil
}

// ValidRingKey checks the overlay and family ("4", "6") that name a ring.
func ValidRingKey(overlay, family string) error {
	if family != "4" && family != "6" {
		return fmt.Errorf("family %q", family)
	}
	return api.ValidateOverlayName(overlay)
}

// IsSpaceMessage tells a space message from a ring message by its
// top-level "kind" key; the decoders check everything else.
func IsSpaceMessage(msg []byte) bool {
	if len(msg) > MaxMessageBytes {
		return false
	}
	var probe struct {
		Kind *string `json:"kind"`
	}
	return json.Unmarshal(msg, &probe) == nil && probe.Kind != nil
}

// JoinRingMessages joins two ring messages waiting to be sent: one ring
// per (overlay, family), two rings of one key joined by the ring CRDT's
// own merge, so that pending sends on a slow link never pile up copies;
// the newer digest (newer's, else older's) is kept. Messages of two
// cluster ids have no join: newer wins, since the older cluster's rings
// are worthless to every receiver.
func JoinRingMessages(older, newer RingMessage) RingMessage {
	if older.ClusterID != "" && newer.ClusterID != "" && older.ClusterID != newer.ClusterID {
		return newer
	}
	out := RingMessage{ClusterID: cmp.Or(newer.ClusterID, older.ClusterID), From: newer.From, Digest: newer.Digest}
	if out.Digest == nil {
		out.From, out.Digest = older.From, older.Digest
	}
	at := map[[2]string]int{}
	for _, e := range slices.Concat(older.Rings, newer.Rings) {
		k := [2]string{e.Overlay, e.Family}
		if i, dup := at[k]; dup {
			out.Rings[i].Ring = joinRings(out.Rings[i].Ring, e.Ring)
			continue
		}
		at[k] = len(out.Rings)
		out.Rings = append(out.Rings, e)
	}
	return out
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
