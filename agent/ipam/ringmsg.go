package ipam

// The wire format of the ring channel: ring messages (deltas, digests,
// bucket hashes, pushes) and their strict decoding. Space requests share
// the channel (spacemsg.go).

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/carve-net/carve/antientropy"
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
	// errBadRingMessage marks a ring message that cannot be decoded.
	errBadRingMessage = errors.New("bad ring message")
	// ErrOtherCluster marks a ring message of another masters' cluster: its
	// leases carry Raft indexes of another log and are refused whole.
	ErrOtherCluster = errors.New("ring message of another cluster")
)

// ringEntry is one overlay family's ring, or part of it, in a gossip
// message: any subset of a ring's entries is a valid ring that joins as
// the whole would (ring.Ring.Delta).
type ringEntry struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Ring    []byte `json:"ring"`
	// N and Buckets, when set, say that Ring holds the sender's entries of
	// these buckets (of N) and ask the receiver for its own entries of the
	// buckets where they still differ after the merge.
	N       int   `json:"n,omitempty"`
	Buckets []int `json:"buckets,omitempty"`
}

// ringBuckets is one ring's bucket hashes (antientropy.Buckets.Encode): 8
// bytes a bucket, big-endian, a power of two of buckets.
type ringBuckets struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hashes  []byte `json:"hashes"`
}

// ringMessage is the payload of RingChannel.
//
// Changes travel as deltas: a broadcast carries only the entries of each
// ring that the other agents do not hold yet (what a grant, a return or a
// free-count update wrote), and each receiver relays only what was news to
// it. What the masters' leases change is never broadcast: every agent
// seeds it into its rings from its own view of the masters.
//
// Anti-entropy, for what a broadcast missed, never sends a whole ring: it
// is package antientropy's protocol over each ring's entries, keyed by
// owner (antientropy.go):
//
//  1. Periodic gossip carries a digest: the digest of every ring the
//     sender serves (antientropy.Digest).
//  2. A receiver whose ring's digest differs unicasts back that ring's
//     bucket hashes (Buckets).
//  3. The digest's sender unicasts its entries of the buckets that differ,
//     naming them (ringEntry.N and Buckets).
//  4. The receiver merges them and, where its entries of those buckets
//     still differ from what it received, unicasts its own back.
//
// Equal rings cost one digest of a few dozen bytes per ring and round; a
// difference costs the bucket hashes and about the size of the buckets
// that differ.
type ringMessage struct {
	// ClusterID is the sender's masters' cluster ("" when it knows none).
	ClusterID string      `json:"cluster_id,omitempty"`
	Rings     []ringEntry `json:"rings,omitempty"`
	// From and Digest: the sender's anti-entropy digest.
	From   string       `json:"from,omitempty"`
	Digest []ringDigest `json:"digest,omitempty"`
	// Buckets answers a digest (by unicast): the bucket hashes of the
	// rings whose digest hash differs.
	Buckets []ringBuckets `json:"buckets,omitempty"`
}

// ringDigest is one ring's entry in a digest.
type ringDigest struct {
	Overlay string `json:"overlay"`
	Family  string `json:"family"`
	Hash    uint64 `json:"hash"`
}

// maxDigestRings bounds the rings of a digest (two families per overlay).
const maxDigestRings = 1024

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
		return ringMessage{}, fmt.Errorf("%w: %d bytes", errBadRingMessage, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return ringMessage{}, fmt.Errorf("%w: %v", errBadRingMessage, err)
	}
	if len(m.ClusterID) > maxClusterIDLen {
		return ringMessage{}, fmt.Errorf("%w: cluster id of %d bytes", errBadRingMessage, len(m.ClusterID))
	}
	for _, e := range m.Rings {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: ring: %v", errBadRingMessage, err)
		}
	}
	if m.Digest != nil {
		if err := api.ValidateAgentID(m.From); err != nil {
			return ringMessage{}, fmt.Errorf("%w: digest sender: %v", errBadRingMessage, err)
		}
		if len(m.Digest) > maxDigestRings {
			return ringMessage{}, fmt.Errorf("%w: digest of %d rings", errBadRingMessage, len(m.Digest))
		}
	}
	for _, e := range m.Digest {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: digest: %v", errBadRingMessage, err)
		}
	}
	for _, e := range m.Rings {
		if e.N == 0 && e.Buckets == nil {
			continue
		}
		if len(e.Buckets) == 0 {
			return ringMessage{}, fmt.Errorf("%w: ring %s/%s: a push naming no bucket of %d", errBadRingMessage, e.Overlay, e.Family, e.N)
		}
		if err := antientropy.ValidBuckets(e.N, e.Buckets); err != nil {
			return ringMessage{}, fmt.Errorf("%w: ring %s/%s: %v", errBadRingMessage, e.Overlay, e.Family, err)
		}
	}
	if len(m.Buckets) > maxDigestRings {
		return ringMessage{}, fmt.Errorf("%w: bucket hashes of %d rings", errBadRingMessage, len(m.Buckets))
	}
	for _, e := range m.Buckets {
		if err := validRingKey(e.Overlay, e.Family); err != nil {
			return ringMessage{}, fmt.Errorf("%w: bucket hashes: %v", errBadRingMessage, err)
		}
		if _, err := antientropy.DecodeBuckets(e.Hashes); err != nil {
			return ringMessage{}, fmt.Errorf("%w: bucket hashes: %v", errBadRingMessage, err)
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
