// Package antientropy is carve's one anti-entropy protocol: how two peers
// holding copies of a replicated set keyed by owner (the agents'
// membership, each overlay's address rings) find, in a few small messages,
// the part of it they hold differently, without ever sending the whole set.
//
// A set is seen as its entries, each with a key (the owner, which places it
// in a bucket) and a 64-bit hash of all of its content (Entries). A round:
//
//  1. Digest: each peer periodically gossips the digest of each set it
//     holds (Digest, 8 bytes): the XOR of its entries' hashes, the same
//     whatever the bucket count.
//  2. Bucket hashes: a receiver whose digest of a set differs unicasts back
//     that set's bucket hashes (BucketHashes, 8 bytes a bucket): its
//     entries hashed into n buckets by key, n = BucketCount of its keys.
//  3. Push: the digest's sender compares them with its own at the same n
//     (Differ) and unicasts its entries of the buckets that differ
//     (Selector), naming the buckets.
//  4. Push back: the receiver merges them and, where its entries of those
//     buckets still differ from what it received (StillDiffer), unicasts
//     its own back.
//
// Equal sets cost one digest per set and round; a difference costs the
// bucket hashes and about the size of the buckets that differ. The
// channels (agent membership, ring gossip) own their messages' framing and
// what a merge accepts: anti-entropy carries entries, it adds no trust.
package antientropy

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Bounds of the protocol, checked when bucket hashes or bucket lists are
// decoded from the network.
const (
	// MaxBuckets bounds the buckets of a message (8 bytes a bucket).
	MaxBuckets = 4096
	// BucketLoad is the number of keys a bucket is sized for.
	BucketLoad = 16
	// DefaultMaxBuckets is the most buckets BucketCount chooses: 2 KiB of
	// hashes, about 20 keys a bucket at 5,000 agents.
	DefaultMaxBuckets = 256
)

// ErrInvalid marks bucket hashes or bucket lists that break the protocol's
// bounds (a count that is not a power of two, too many buckets, a bucket
// out of range).
var ErrInvalid = errors.New("invalid anti-entropy message")

// Entries yields the entries of one copy of a set: for each, its key (the
// owner whose bucket holds it) and a hash of all of its content (Hash). A
// key may yield several entries.
type Entries func(yield func(key string, h uint64))

// Hash is the content hash of an entry's canonical encoding: 64-bit
// FNV-1a, the same on every peer and cheap enough to hash every entry of a
// set of thousands of agents in each round.
func Hash(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// mix64 is MurmurHash3's 64-bit finalizer: FNV's low bits depend only on
// the low bits of the input bytes, and agent ids that differ in a few
// characters would crowd into a few buckets.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// BucketOf is the bucket (of n, a power of two) of a key's entries.
func BucketOf(key string, n int) int {
	return int(mix64(Hash([]byte(key))) & uint64(n-1))
}

// BucketCount is the bucket count for a set of keys keys: a power of two,
// about BucketLoad keys a bucket, at most DefaultMaxBuckets.
func BucketCount(keys int) int {
	n := 1
	for n*BucketLoad < keys && n < DefaultMaxBuckets {
		n *= 2
	}
	return n
}

// ValidCount checks a bucket count from the network: a power of two from 1
// to MaxBuckets.
func ValidCount(n int) error {
	if n < 1 || n > MaxBuckets || n&(n-1) != 0 {
		return fmt.Errorf("%w: %d buckets: want a power of two from 1 to %d", ErrInvalid, n, MaxBuckets)
	}
	return nil
}

// Digest is a set's digest: the XOR of its entries' hashes, which equals
// the XOR of its bucket hashes at any bucket count.
func Digest(e Entries) uint64 {
	var d uint64
	e(func(_ string, h uint64) { d ^= h })
	return d
}

// BucketHashes hashes a set's entries into n buckets (n a valid count) by
// key: per bucket, the XOR of its entries' hashes. Two copies hold the same
// entries of a bucket's keys exactly when (but for hash collisions) the
// bucket's hashes are equal.
func BucketHashes(e Entries, n int) (Buckets, error) {
	if err := ValidCount(n); err != nil {
		return nil, err
	}
	out := make(Buckets, n)
	memo := map[string]int{}
	e(func(key string, h uint64) {
		b, ok := memo[key]
		if !ok {
			b = BucketOf(key, n)
			memo[key] = b
		}
		out[b] ^= h
	})
	return out, nil
}

// Buckets are a set's bucket hashes, one per bucket.
type Buckets []uint64

// Encode is the wire form of bucket hashes: 8 bytes a bucket, big-endian.
func (b Buckets) Encode() []byte {
	out := make([]byte, 0, 8*len(b))
	for _, v := range b {
		out = binary.BigEndian.AppendUint64(out, v)
	}
	return out
}

// DecodeBuckets reads bucket hashes from the network, checking their count.
func DecodeBuckets(raw []byte) (Buckets, error) {
	if len(raw)%8 != 0 {
		return nil, fmt.Errorf("%w: bucket hashes of %d bytes: want 8 bytes a bucket", ErrInvalid, len(raw))
	}
	n := len(raw) / 8
	if err := ValidCount(n); err != nil {
		return nil, err
	}
	out := make(Buckets, n)
	for i := range out {
		out[i] = binary.BigEndian.Uint64(raw[8*i:])
	}
	return out, nil
}

// Differ returns, in order, the buckets whose hashes differ between two
// copies' bucket hashes at the same count (step 3).
func Differ(mine, theirs Buckets) ([]int, error) {
	if len(mine) != len(theirs) {
		return nil, fmt.Errorf("%w: %d bucket hashes against %d", ErrInvalid, len(theirs), len(mine))
	}
	var out []int
	for i := range mine {
		if mine[i] != theirs[i] {
			out = append(out, i)
		}
	}
	return out, nil
}

// ValidBuckets checks a list of buckets (of n) from the network: each in
// range, none twice, at most n.
func ValidBuckets(n int, buckets []int) error {
	if err := ValidCount(n); err != nil {
		return err
	}
	if len(buckets) > n {
		return fmt.Errorf("%w: %d buckets named of %d", ErrInvalid, len(buckets), n)
	}
	seen := make(map[int]bool, len(buckets))
	for _, b := range buckets {
		if b < 0 || b >= n || seen[b] {
			return fmt.Errorf("%w: bucket %d of %d (out of range or named twice)", ErrInvalid, b, n)
		}
		seen[b] = true
	}
	return nil
}

// Selector returns whether a key is in one of the given buckets (of n):
// what picks the entries a push carries (steps 3 and 4).
func Selector(n int, buckets []int) (func(key string) bool, error) {
	if err := ValidBuckets(n, buckets); err != nil {
		return nil, err
	}
	want := make([]bool, n)
	for _, b := range buckets {
		want[b] = true
	}
	memo := map[string]bool{}
	return func(key string) bool {
		in, ok := memo[key]
		if !ok {
			in = want[BucketOf(key, n)]
			memo[key] = in
		}
		return in
	}, nil
}

// StillDiffer returns, of the buckets (of n) a push named, those where the
// receiver's entries, after merging the push, differ from the pushed ones
// (step 4): the pusher lacks something there, or holds something older.
func StillDiffer(mine, pushed Entries, n int, buckets []int) ([]int, error) {
	if err := ValidBuckets(n, buckets); err != nil {
		return nil, err
	}
	m, err := BucketHashes(mine, n)
	if err != nil {
		return nil, err
	}
	p, err := BucketHashes(pushed, n)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, b := range buckets {
		if m[b] != p[b] {
			out = append(out, b)
		}
	}
	return out, nil
}

// Digest is the set's digest (step 1) from its bucket hashes: their XOR,
// so that a peer holding its bucket hashes has the digest without hashing
// its entries again.
func (b Buckets) Digest() uint64 {
	var d uint64
	for _, v := range b {
		d ^= v
	}
	return d
}
