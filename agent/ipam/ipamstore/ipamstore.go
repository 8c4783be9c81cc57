// Package ipamstore is the IPAM's part of the agent's bbolt store: its
// buckets, their keys and record formats (allocations, held blocks, rings,
// granted requests, grown blocks given back, recent releases, the outbox
// of reports due to the masters), the writes a group commit applies in one
// transaction, and what the IPAM reads back when it starts. It decides
// nothing: the IPAM (package ipam) chooses what to write and when; this
// package only says how it lies on disk.
//
// Its exported surface is this file.
package ipamstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// The IPAM's buckets in the agent's store. An allocation is one key, made
// durable before it is answered, so that after a crash at any point a
// restarted agent holds every address it gave out and has not taken back.
const (
	AllocBucket = "ipam-allocations" // "<overlay>\x00<container>\x00<ifname>" -> Alloc
	// GrantedBucket remembers the space requests this agent granted, so
	// that a request repeated after a restart gets the same block, not a
	// second one: "<from>\x00<request id>" -> prefix.
	GrantedBucket = "ipam-granted"
	RingBucket    = "ipam-rings" // "<overlay>/<family>" -> ring encoding
	MetaBucket    = "ipam-meta"  // KeyClusterID -> the cluster the rings belong to
	// ReleasedBucket holds the attachments released lately (AllocKey ->
	// the release's time, unix nanoseconds): written with the
	// allocation's deletion, so that a restarted agent knows what the one
	// before it released.
	ReleasedBucket = "ipam-released"
	// BlocksBucket holds the blocks a bridge holds beyond its first
	// sub-subnet: "<overlay>/<family>/<prefix>" -> Block.
	BlocksBucket = "ipam-blocks"
	// ReturnedBucket holds the grown blocks this agent gave back, until a
	// record of the masters no longer lists them: "<prefix>" -> the
	// block's lease version (8 bytes). Until then the record a restart
	// loads may still list one, and it is not taken back from there: the
	// masters free it as the return lands.
	ReturnedBucket = "ipam-returned"
	// OutboxBucket holds what the masters must learn and may not be
	// reachable for (request id -> OutboxEntry): written in the same
	// group commit as the change it reports, emptied as the masters
	// acknowledge.
	OutboxBucket = "ipam-outbox"
	KeyClusterID = "cluster_id"
)

// Alloc is a persisted attachment. Records written before owners were
// kept have no owner, and load as such.
type Alloc struct {
	Bridge string     `json:"bridge"`
	V4     netip.Addr `json:"v4,omitzero"`
	V6     netip.Addr `json:"v6,omitzero"`
	Owner  *api.Owner `json:"owner,omitempty"`
}

// Kinds of outbox entries.
const (
	OutboxGrant  = "grant"
	OutboxReturn = "return"
)

// OutboxEntry is one report due to the masters.
type OutboxEntry struct {
	Kind      string       `json:"kind"`
	Overlay   string       `json:"overlay"`
	Prefix    netip.Prefix `json:"prefix"`
	Donor     string       `json:"donor,omitempty"`
	Recipient string       `json:"recipient,omitempty"`
	Bridge    string       `json:"bridge,omitempty"`
	RequestID string       `json:"request_id"`
	// Expires and DonorSignature are a grant's signed statement (see
	// api.GrantSigningBytes), which the masters require of a recipient.
	Expires        int64  `json:"expires,omitempty"`
	DonorSignature string `json:"donor_signature,omitempty"`
	// Version is a returned grown block's lease version: until the masters
	// take the return, their record still lists the block, and a restart
	// must not take it back from that record.
	Version uint64 `json:"version,omitempty"`
	// RestoreEpoch is, for a return, the masters' restore epoch of the
	// record the return was decided on (api.ReturnRequest.RestoreEpoch).
	RestoreEpoch uint64 `json:"restore_epoch,omitempty"`
	// LeaseVersion is, for a granted block's return to its donor, the
	// version the masters' record listed the block at, sent as
	// api.ReturnRequest.Version; such an entry has no Version, which Load
	// reads as given back for any lease of the block (it is back in its
	// donor's ring).
	LeaseVersion uint64 `json:"lease_version,omitempty"`
}

// ReportedVersion is the lease version a return names to the masters.
func (e OutboxEntry) ReportedVersion() uint64 {
	if e.Version != 0 {
		return e.Version
	}
	return e.LeaseVersion
}

// AllocKey is an attachment's key in AllocBucket (and the IPAM's key of
// an attachment with a change in flight).
func AllocKey(network string, at ring.Attachment) string {
	return network + "\x00" + at.ContainerID + "\x00" + at.Interface
}

func parseAllocKey(k []byte) (string, ring.Attachment, bool) {
	parts := strings.SplitN(string(k), "\x00", 3)
	if len(parts) != 3 {
		return "", ring.Attachment{}, false
	}
	return parts[0], ring.Attachment{ContainerID: parts[1], Interface: parts[2]}, true
}

// ringKey is a ring's key in RingBucket.
func ringKey(overlay string, fam int) string { return overlay + "/" + ipfamily.Name(fam) }

// BlockKey is a held block's key in BlocksBucket.
func BlockKey(overlay string, fam int, p netip.Prefix) string {
	return overlay + "/" + ipfamily.Name(fam) + "/" + p.String()
}

// Write is one change of a transaction; a nil value deletes the key.
type Write struct {
	Bucket string
	Key    string
	Value  []byte
}

// PutClusterID records the cluster the rings belong to.
func PutClusterID(clusterID string) Write {
	return Write{Bucket: MetaBucket, Key: KeyClusterID, Value: []byte(clusterID)}
}

// PutAlloc writes an attachment's record.
func PutAlloc(network string, at ring.Attachment, rec Alloc) Write {
	data, _ := json.Marshal(rec) // addresses and strings: cannot fail
	return Write{Bucket: AllocBucket, Key: AllocKey(network, at), Value: data}
}

// DeleteAlloc deletes an attachment's record.
func DeleteAlloc(network string, at ring.Attachment) Write {
	return Write{Bucket: AllocBucket, Key: AllocKey(network, at)}
}

// PutReleased records the release of an attachment (its AllocKey) at when.
func PutReleased(key string, when time.Time) Write {
	return Write{Bucket: ReleasedBucket, Key: key, Value: binary.BigEndian.AppendUint64(nil, uint64(when.UnixNano()))}
}

// DeleteReleased forgets the release of an attachment (its AllocKey).
func DeleteReleased(key string) Write {
	return Write{Bucket: ReleasedBucket, Key: key}
}

// PutReturned remembers a grown block given back, at its lease version.
func PutReturned(p netip.Prefix, version uint64) Write {
	return Write{Bucket: ReturnedBucket, Key: p.String(), Value: binary.BigEndian.AppendUint64(nil, version)}
}

// DeleteReturned forgets a grown block given back.
func DeleteReturned(p netip.Prefix) Write {
	return Write{Bucket: ReturnedBucket, Key: p.String()}
}

// PutGranted remembers the block granted on a peer's space request.
func PutGranted(from, id string, p netip.Prefix) Write {
	return Write{Bucket: GrantedBucket, Key: from + "\x00" + id, Value: []byte(p.String())}
}

// DeleteGranted forgets a granted space request.
func DeleteGranted(from, id string) Write {
	return Write{Bucket: GrantedBucket, Key: from + "\x00" + id}
}

// PutRing writes the ring of an overlay family (0: IPv4, 1: IPv6).
func PutRing(overlay string, fam int, enc []byte) Write {
	return Write{Bucket: RingBucket, Key: ringKey(overlay, fam), Value: enc}
}

// PutBlock writes a held block's record (its JSON, the IPAM's format) of
// an overlay family (0: IPv4, 1: IPv6).
func PutBlock(overlay string, fam int, p netip.Prefix, record []byte) Write {
	return Write{Bucket: BlocksBucket, Key: BlockKey(overlay, fam, p), Value: record}
}

// DeleteBlock deletes a held block.
func DeleteBlock(overlay string, fam int, p netip.Prefix) Write {
	return Write{Bucket: BlocksBucket, Key: BlockKey(overlay, fam, p)}
}

// PutOutbox queues a report to the masters.
func PutOutbox(e OutboxEntry) Write {
	data, _ := json.Marshal(e) // strings and a prefix: cannot fail
	return Write{Bucket: OutboxBucket, Key: e.RequestID, Value: data}
}

// DeleteOutbox drops a report the masters took (or refused for good).
func DeleteOutbox(requestID string) Write {
	return Write{Bucket: OutboxBucket, Key: requestID}
}

// Apply makes the writes in tx, in order.
func Apply(tx *bolt.Tx, writes []Write) error {
	for _, w := range writes {
		b := tx.Bucket([]byte(w.Bucket))
		var err error
		if w.Value == nil {
			err = b.Delete([]byte(w.Key))
		} else {
			err = b.Put([]byte(w.Key), w.Value)
		}
		if err != nil {
			return fmt.Errorf("%s %q: %w", w.Bucket, w.Key, err)
		}
	}
	return nil
}

// Loaded is what the IPAM finds in the store when it starts.
type Loaded struct {
	Allocations map[string]map[ring.Attachment]Alloc // by overlay
	Granted     map[[2]string]netip.Prefix           // (from, request id) -> block
	Returned    map[netip.Prefix]uint64              // ReturnedBucket: grown blocks given back, lease versions
	ClusterID   string
	Released    map[string]time.Time // AllocKey -> release, ReleasedBucket
}

// Load creates the IPAM's buckets and reads the allocations, the granted
// requests, the grown blocks given back (ReturnedBucket, and the returns
// in the outbox), the releases of the last releaseMemory (older ones are
// deleted) and the cluster id of the rings, and hands every held block's
// record to block, whose error fails the load (and its transaction). The
// rings themselves are read when their overlay is seeded (RingStore).
func Load(db *bolt.DB, releaseMemory time.Duration, block func(key, record []byte) error) (Loaded, error) {
	out := Loaded{Allocations: map[string]map[ring.Attachment]Alloc{}, Granted: map[[2]string]netip.Prefix{},
		Returned: map[netip.Prefix]uint64{}, Released: map[string]time.Time{}}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{AllocBucket, RingBucket, MetaBucket, BlocksBucket, OutboxBucket, GrantedBucket, ReleasedBucket, ReturnedBucket} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		out.ClusterID = string(tx.Bucket([]byte(MetaBucket)).Get([]byte(KeyClusterID)))
		if err := tx.Bucket([]byte(ReleasedBucket)).ForEach(func(k, v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("corrupt release record %q", k)
			}
			out.Released[string(k)] = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
			return nil
		}); err != nil {
			return err
		}
		for k, when := range out.Released {
			if time.Since(when) > releaseMemory {
				delete(out.Released, k)
				if err := tx.Bucket([]byte(ReleasedBucket)).Delete([]byte(k)); err != nil {
					return err
				}
			}
		}
		if err := tx.Bucket([]byte(BlocksBucket)).ForEach(block); err != nil {
			return err
		}
		if err := tx.Bucket([]byte(ReturnedBucket)).ForEach(func(k, v []byte) error {
			p, err := netip.ParsePrefix(string(k))
			if err != nil || len(v) != 8 {
				return fmt.Errorf("corrupt return record %q", k)
			}
			out.Returned[p] = max(out.Returned[p], binary.BigEndian.Uint64(v))
			return nil
		}); err != nil {
			return err
		}
		// The returns an agent of a release before ReturnedBucket left in
		// its outbox: the masters have not taken them yet.
		if err := tx.Bucket([]byte(OutboxBucket)).ForEach(func(k, v []byte) error {
			var e OutboxEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("corrupt outbox entry %q: %w", k, err)
			}
			if e.Kind != OutboxReturn || !e.Prefix.IsValid() {
				return nil
			}
			version := e.Version
			if version == 0 {
				version = math.MaxUint64 // written before versions were: any lease of it
			}
			out.Returned[e.Prefix] = max(out.Returned[e.Prefix], version)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket([]byte(GrantedBucket)).ForEach(func(k, v []byte) error {
			from, id, ok := strings.Cut(string(k), "\x00")
			p, err := netip.ParsePrefix(string(v))
			if !ok || err != nil {
				return fmt.Errorf("corrupt grant record %q", k)
			}
			out.Granted[[2]string{from, id}] = p
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket([]byte(AllocBucket)).ForEach(func(k, v []byte) error {
			network, at, ok := parseAllocKey(k)
			var rec Alloc
			if !ok || json.Unmarshal(v, &rec) != nil {
				return fmt.Errorf("corrupt allocation record %q", k)
			}
			if out.Allocations[network] == nil {
				out.Allocations[network] = map[ring.Attachment]Alloc{}
			}
			out.Allocations[network][at] = rec
			return nil
		})
	})
	if err != nil {
		return Loaded{}, fmt.Errorf("ipam: load allocations: %w", err)
	}
	return out, nil
}

// RingStore reads the persisted rings; Path is the store's file, named in
// errors (a closed bolt.DB forgets it).
type RingStore struct {
	DB   *bolt.DB
	Path string
}

// ErrRingUnread marks a persisted ring that could not be read: its
// overlay family is not served rather than started with a fresh ring,
// which would forget the grants this agent gave (they live only in the
// ring) and hand their addresses out again.
var ErrRingUnread = errors.New("the persisted ring could not be read")

// SavedRing returns the persisted ring of an overlay family (nil when
// none), or an error (ErrRingUnread) naming the store and the fix when it
// cannot be read.
func (st RingStore) SavedRing(overlay string, fam int) ([]byte, error) {
	var out []byte
	err := st.DB.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(RingBucket))
		if b == nil {
			return fmt.Errorf("no bucket %q", RingBucket)
		}
		if v := b.Get([]byte(ringKey(overlay, fam))); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: overlay %q, IPv%s, from %s: %w; the overlay is not served until it is read (a fresh ring would forget the blocks this agent granted to peers): make the file readable (disk, permissions) and the agent reads it again at its next sync, or restart it; do not delete it",
			ErrRingUnread, overlay, ipfamily.Name(fam), st.Path, err)
	}
	return out, nil
}

// ForgetRings deletes every persisted ring and records the cluster they
// will belong to from now on, in one transaction.
func ForgetRings(db *bolt.DB, clusterID string) error {
	return db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket([]byte(RingBucket)); err != nil {
			return err
		}
		if _, err := tx.CreateBucket([]byte(RingBucket)); err != nil {
			return err
		}
		return tx.Bucket([]byte(MetaBucket)).Put([]byte(KeyClusterID), []byte(clusterID))
	})
}

// ReadOutbox reads the pending reports, in request id order.
func ReadOutbox(db *bolt.DB) ([]OutboxEntry, error) {
	var out []OutboxEntry
	err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(OutboxBucket)).ForEach(func(k, v []byte) error {
			var e OutboxEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("corrupt outbox entry %q: %w", k, err)
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}
