package ipam

import (
	"encoding/json"
	"fmt"

	"github.com/carve-net/carve/ring"
)

// RingRoundBytes is what one anti-entropy round of one ring between two
// agents sends, by message, as the agents encode them.
type RingRoundBytes struct {
	Digest, Buckets, Push int
	// Messages is the number of messages (the digest included).
	Messages int
}

// Total is the bytes of the whole round.
func (b RingRoundBytes) Total() int { return b.Digest + b.Buckets + b.Push }

// RingAntiEntropyRound runs one anti-entropy round of one overlay's ring
// from a (which sends its digest) to b, in process, merging what each
// receives, and returns the bytes of every message as the agents encode
// them: the handler's exchange without the network, for tests and benches
// that measure message sizes deterministically.
func RingAntiEntropyRound(clusterID, overlay, aID, bID string, a, b *ring.Ring) (RingRoundBytes, error) {
	var out RingRoundBytes
	family := ringFamily(a)
	size := func(m ringMessage) (int, error) {
		enc, err := json.Marshal(m)
		out.Messages++
		return len(enc), err
	}
	var err error
	hash := ringHash(a.Encode())
	if out.Digest, err = size(ringMessage{ClusterID: clusterID, From: aID, Digest: []ringDigest{{Overlay: overlay, Family: family, Hash: hash}}}); err != nil {
		return out, err
	}
	if hash == ringHash(b.Encode()) {
		return out, nil
	}
	hb, err := b.BucketHashes(ringBucketCount(b.Owners()))
	if err != nil {
		return out, err
	}
	theirs := ringBuckets{Overlay: overlay, Family: family, Hashes: packHashes(hb)}
	if out.Buckets, err = size(ringMessage{ClusterID: clusterID, From: bID, Buckets: []ringBuckets{theirs}}); err != nil {
		return out, err
	}
	ha, err := a.BucketHashes(len(hb))
	if err != nil {
		return out, err
	}
	push, ok := bucketPush(a, ha, theirs)
	if !ok {
		return out, nil
	}
	if err := sendPart(&out, size, clusterID, push, b); err != nil {
		return out, err
	}
	if back, ok := pushBackEntry(b, push); ok {
		if err := sendPart(&out, size, clusterID, back, a); err != nil {
			return out, err
		}
	}
	return out, nil
}

// sendPart counts a push and merges it into the receiver's ring.
func sendPart(out *RingRoundBytes, size func(ringMessage) (int, error), clusterID string, e ringEntry, to *ring.Ring) error {
	n, err := size(ringMessage{ClusterID: clusterID, Rings: []ringEntry{e}})
	if err != nil {
		return err
	}
	out.Push += n
	part, err := ring.Decode(e.Ring)
	if err != nil {
		return fmt.Errorf("a push does not decode: %w", err)
	}
	_, err = to.Merge(part)
	return err
}

// RingDeltaBytes is the size of the broadcast that announces what after
// holds and before does not, as an agent encodes it (0: nothing to send).
func RingDeltaBytes(clusterID, overlay string, before, after *ring.Ring) (int, error) {
	d, ok := after.Delta(before)
	if !ok {
		return 0, nil
	}
	enc, err := json.Marshal(ringMessage{ClusterID: clusterID, Rings: []ringEntry{{Overlay: overlay, Family: ringFamily(after), Ring: d.Encode()}}})
	return len(enc), err
}

// ringFamily is a ring's family as the ring messages write it.
func ringFamily(r *ring.Ring) string {
	if r.Universe().Addr().Is4() {
		return familyName(0)
	}
	return familyName(1)
}
