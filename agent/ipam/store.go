package ipam

// The IPAM's records as package ipamstore lays them on disk, in the
// IPAM's own types: what the group commit writes (write) and what New
// reads back (load).

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/ring"
)

// allocKey is an attachment's key in the store, and in Service.pending.
func allocKey(network string, at ring.Attachment) string { return ipamstore.AllocKey(network, at) }

// write is one change of a transaction.
type write = ipamstore.Write

func putAlloc(network string, at ring.Attachment, rec allocRecord) write {
	return ipamstore.PutAlloc(network, at, ipamstore.Alloc(rec))
}

func deleteAlloc(network string, at ring.Attachment) write { return ipamstore.DeleteAlloc(network, at) }

func putReleased(key string, when time.Time) write { return ipamstore.PutReleased(key, when) }

func deleteReleased(key string) write { return ipamstore.DeleteReleased(key) }

func putRing(overlay string, fam int, enc []byte) write { return ipamstore.PutRing(overlay, fam, enc) }

// loaded is what the IPAM finds in the store when it starts.
type loaded struct {
	allocations map[string]map[ring.Attachment]allocRecord // by overlay
	blocks      map[string][]*heldBlock                    // by overlay
	granted     map[[2]string]netip.Prefix                 // (from, request id) -> block
	returned    map[netip.Prefix]uint64                    // grown blocks given back, lease versions
	clusterID   string
	released    map[string]time.Time // allocKey -> release
}

// load creates the IPAM's buckets and reads what it persisted
// (ipamstore.Load). The rings themselves are read when their overlay is
// seeded (ringStore).
func load(db *bolt.DB) (loaded, error) {
	blocks := map[string][]*heldBlock{}
	st, err := ipamstore.Load(db, releaseMemory, func(k, v []byte) error {
		var b heldBlock
		if err := json.Unmarshal(v, &b); err != nil || !b.Prefix.IsValid() || b.Family < 0 || b.Family >= families ||
			ipamstore.BlockKey(b.Overlay, b.Family, b.Prefix) != string(k) {
			return fmt.Errorf("corrupt block record %q", k)
		}
		blocks[b.Overlay] = append(blocks[b.Overlay], &b)
		return nil
	})
	if err != nil {
		return loaded{}, err
	}
	out := loaded{allocations: map[string]map[ring.Attachment]allocRecord{}, blocks: blocks,
		granted: st.Granted, returned: st.Returned, clusterID: st.ClusterID, released: st.Released}
	for network, m := range st.Allocations {
		out.allocations[network] = make(map[ring.Attachment]allocRecord, len(m))
		for at, rec := range m {
			out.allocations[network][at] = allocRecord(rec)
		}
	}
	return out, nil
}

// ringStore reads the persisted rings for a sync (overlayspace.RingDisk).
type ringStore ipamstore.RingStore

// errRingUnread marks a persisted ring that could not be read
// (ipamstore.ErrRingUnread).
var errRingUnread = ipamstore.ErrRingUnread

// SavedRing reads an overlay family's persisted ring (nil: none).
func (st ringStore) SavedRing(overlay string, fam int) ([]byte, error) {
	return ipamstore.RingStore(st).SavedRing(overlay, fam)
}
