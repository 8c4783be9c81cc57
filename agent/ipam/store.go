package ipam

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

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// The IPAM's buckets in the agent's store. An allocation is one key, made
// durable before it is answered, so that after a crash at any point a
// restarted agent holds every address it gave out and has not taken back.
const (
	allocBucket = "ipam-allocations" // "<overlay>\x00<container>\x00<ifname>" -> allocRecord
	// grantedBucket remembers the space requests this agent granted, so
	// that a request repeated after a restart gets the same block, not a
	// second one: "<from>\x00<request id>" -> prefix.
	grantedBucket = "ipam-granted"
	ringBucket    = "ipam-rings" // "<overlay>/<family>" -> ring encoding
	metaBucket    = "ipam-meta"  // keyClusterID -> the cluster the rings belong to
	// releasedBucket holds the attachments released within releaseMemory
	// (allocKey -> the release's time, unix nanoseconds): written with the
	// allocation's deletion, so that a restarted agent knows what the one
	// before it released (recentReleases).
	releasedBucket = "ipam-released"
	// returnedBucket holds the grown blocks this agent gave back, until a
	// record of the masters no longer lists them: "<prefix>" -> the
	// block's lease version (8 bytes). Until then the record a restart
	// loads may still list one, and it is not taken back from there
	// (learnMasterBlocks): the masters free it as the return lands.
	returnedBucket = "ipam-returned"
	keyClusterID   = "cluster_id"
)

// allocRecord is a persisted attachment. Records written before owners
// were kept have no owner, and load as such.
type allocRecord struct {
	Bridge string     `json:"bridge"`
	V4     netip.Addr `json:"v4,omitzero"`
	V6     netip.Addr `json:"v6,omitzero"`
	Owner  *api.Owner `json:"owner,omitempty"`
}

// addr returns the record's address of a family (0: IPv4, 1: IPv6).
func (r allocRecord) addr(fam int) netip.Addr {
	if fam == 0 {
		return r.V4
	}
	return r.V6
}

// setAddr sets the record's address of a family.
func (r *allocRecord) setAddr(fam int, a netip.Addr) {
	if fam == 0 {
		r.V4 = a
	} else {
		r.V6 = a
	}
}

func (r allocRecord) empty() bool { return !r.V4.IsValid() && !r.V6.IsValid() }

// allocKey is an attachment's key in allocBucket, and in Service.pending.
func allocKey(network string, at ring.Attachment) string {
	return network + "\x00" + at.ContainerID + "\x00" + at.Interface
}

func parseAllocKey(k []byte) (string, ring.Attachment, bool) {
	parts := strings.SplitN(string(k), "\x00", 3)
	if len(parts) != 3 {
		return "", ring.Attachment{}, false
	}
	return parts[0], ring.Attachment{ContainerID: parts[1], Interface: parts[2]}, true
}

// ringKey is a ring's key in ringBucket.
func ringKey(overlay string, fam int) string { return overlay + "/" + familyName(fam) }

// write is one change of a transaction; a nil value deletes the key.
type write struct {
	bucket string
	key    string
	value  []byte
}

func putAlloc(network string, at ring.Attachment, rec allocRecord) write {
	data, _ := json.Marshal(rec) // addresses and strings: cannot fail
	return write{bucket: allocBucket, key: allocKey(network, at), value: data}
}

func deleteAlloc(network string, at ring.Attachment) write {
	return write{bucket: allocBucket, key: allocKey(network, at)}
}

func putReleased(key string, when time.Time) write {
	return write{bucket: releasedBucket, key: key, value: binary.BigEndian.AppendUint64(nil, uint64(when.UnixNano()))}
}

func deleteReleased(key string) write {
	return write{bucket: releasedBucket, key: key}
}

func putReturned(p netip.Prefix, version uint64) write {
	return write{bucket: returnedBucket, key: p.String(), value: binary.BigEndian.AppendUint64(nil, version)}
}

func deleteReturned(p netip.Prefix) write {
	return write{bucket: returnedBucket, key: p.String()}
}

func putGranted(from, id string, p netip.Prefix) write {
	return write{bucket: grantedBucket, key: from + "\x00" + id, value: []byte(p.String())}
}

func deleteGranted(from, id string) write {
	return write{bucket: grantedBucket, key: from + "\x00" + id}
}

func putRing(overlay string, fam int, enc []byte) write {
	return write{bucket: ringBucket, key: ringKey(overlay, fam), value: enc}
}

// apply makes the writes in tx, in order.
func apply(tx *bolt.Tx, writes []write) error {
	for _, w := range writes {
		b := tx.Bucket([]byte(w.bucket))
		var err error
		if w.value == nil {
			err = b.Delete([]byte(w.key))
		} else {
			err = b.Put([]byte(w.key), w.value)
		}
		if err != nil {
			return fmt.Errorf("%s %q: %w", w.bucket, w.key, err)
		}
	}
	return nil
}

// loaded is what the IPAM finds in the store when it starts.
type loaded struct {
	allocations map[string]map[ring.Attachment]allocRecord // by overlay
	blocks      map[string][]*heldBlock                    // by overlay
	granted     map[[2]string]netip.Prefix                 // (from, request id) -> block
	returned    map[netip.Prefix]uint64                    // returnedBucket: grown blocks given back, lease versions
	clusterID   string
	released    map[string]time.Time // allocKey -> release, releasedBucket
}

// load creates the IPAM's buckets and reads the allocations and the
// cluster id of the rings. The rings themselves are read when their overlay
// is seeded.
func load(db *bolt.DB) (loaded, error) {
	out := loaded{allocations: map[string]map[ring.Attachment]allocRecord{}, granted: map[[2]string]netip.Prefix{},
		returned: map[netip.Prefix]uint64{}, released: map[string]time.Time{}}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{allocBucket, ringBucket, metaBucket, blocksBucket, outboxBucket, grantedBucket, releasedBucket, returnedBucket} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		out.clusterID = string(tx.Bucket([]byte(metaBucket)).Get([]byte(keyClusterID)))
		if err := tx.Bucket([]byte(releasedBucket)).ForEach(func(k, v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("corrupt release record %q", k)
			}
			out.released[string(k)] = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
			return nil
		}); err != nil {
			return err
		}
		for k, when := range out.released {
			if time.Since(when) > releaseMemory {
				delete(out.released, k)
				if err := tx.Bucket([]byte(releasedBucket)).Delete([]byte(k)); err != nil {
					return err
				}
			}
		}
		var err error
		if out.blocks, err = loadBlocks(tx); err != nil {
			return err
		}
		if err := tx.Bucket([]byte(returnedBucket)).ForEach(func(k, v []byte) error {
			p, err := netip.ParsePrefix(string(k))
			if err != nil || len(v) != 8 {
				return fmt.Errorf("corrupt return record %q", k)
			}
			out.returned[p] = max(out.returned[p], binary.BigEndian.Uint64(v))
			return nil
		}); err != nil {
			return err
		}
		// The returns an agent of a release before returnedBucket left in
		// its outbox: the masters have not taken them yet.
		if err := tx.Bucket([]byte(outboxBucket)).ForEach(func(k, v []byte) error {
			var e outboxEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("corrupt outbox entry %q: %w", k, err)
			}
			if e.Kind != outboxReturn || !e.Prefix.IsValid() {
				return nil
			}
			version := e.Version
			if version == 0 {
				version = math.MaxUint64 // written before versions were: any lease of it
			}
			out.returned[e.Prefix] = max(out.returned[e.Prefix], version)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket([]byte(grantedBucket)).ForEach(func(k, v []byte) error {
			from, id, ok := strings.Cut(string(k), "\x00")
			p, err := netip.ParsePrefix(string(v))
			if !ok || err != nil {
				return fmt.Errorf("corrupt grant record %q", k)
			}
			out.granted[[2]string{from, id}] = p
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket([]byte(allocBucket)).ForEach(func(k, v []byte) error {
			network, at, ok := parseAllocKey(k)
			var rec allocRecord
			if !ok || json.Unmarshal(v, &rec) != nil {
				return fmt.Errorf("corrupt allocation record %q", k)
			}
			if out.allocations[network] == nil {
				out.allocations[network] = map[ring.Attachment]allocRecord{}
			}
			out.allocations[network][at] = rec
			return nil
		})
	})
	if err != nil {
		return loaded{}, fmt.Errorf("ipam: load allocations: %w", err)
	}
	return out, nil
}

// ringStore reads the persisted rings (ringDisk); path is the store's
// file, named in errors (a closed bolt.DB forgets it).
type ringStore struct {
	db   *bolt.DB
	path string
}

// errRingUnread marks a persisted ring that could not be read: its
// overlay family is not served rather than started with a fresh ring,
// which would forget the grants this agent gave (they live only in the
// ring) and hand their addresses out again.
var errRingUnread = errors.New("the persisted ring could not be read")

// savedRing returns the persisted ring of an overlay family (nil when
// none), or an error (errRingUnread) naming the store and the fix when it
// cannot be read.
func (st ringStore) savedRing(overlay string, fam int) ([]byte, error) {
	var out []byte
	err := st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(ringBucket))
		if b == nil {
			return fmt.Errorf("no bucket %q", ringBucket)
		}
		if v := b.Get([]byte(ringKey(overlay, fam))); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: overlay %q, IPv%s, from %s: %w; the overlay is not served until it is read (a fresh ring would forget the blocks this agent granted to peers): make the file readable (disk, permissions) and the agent reads it again at its next sync, or restart it; do not delete it",
			errRingUnread, overlay, familyName(fam), st.path, err)
	}
	return out, nil
}

// forgetRings deletes every persisted ring and records the cluster they will
// belong to from now on, in one transaction.
func forgetRings(db *bolt.DB, clusterID string) error {
	return db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket([]byte(ringBucket)); err != nil {
			return err
		}
		if _, err := tx.CreateBucket([]byte(ringBucket)); err != nil {
			return err
		}
		return tx.Bucket([]byte(metaBucket)).Put([]byte(keyClusterID), []byte(clusterID))
	})
}

// blocksBucket holds the blocks a bridge holds beyond its first sub-subnet:
// "<overlay>/<family>/<prefix>" -> heldBlock.
const blocksBucket = "ipam-blocks"

func blockKey(overlay string, fam int, p netip.Prefix) string {
	return overlay + "/" + familyName(fam) + "/" + p.String()
}

func putBlock(b *heldBlock) write {
	data, _ := json.Marshal(b) // strings, numbers and a prefix: cannot fail
	return write{bucket: blocksBucket, key: blockKey(b.Overlay, b.Family, b.Prefix), value: data}
}

func deleteBlock(b *heldBlock) write {
	return write{bucket: blocksBucket, key: blockKey(b.Overlay, b.Family, b.Prefix)}
}

// loadBlocks reads the persisted blocks, by overlay.
func loadBlocks(tx *bolt.Tx) (map[string][]*heldBlock, error) {
	out := map[string][]*heldBlock{}
	err := tx.Bucket([]byte(blocksBucket)).ForEach(func(k, v []byte) error {
		var b heldBlock
		if err := json.Unmarshal(v, &b); err != nil || !b.Prefix.IsValid() || b.Family < 0 || b.Family >= families ||
			blockKey(b.Overlay, b.Family, b.Prefix) != string(k) {
			return fmt.Errorf("corrupt block record %q", k)
		}
		out[b.Overlay] = append(out[b.Overlay], &b)
		return nil
	})
	return out, err
}
