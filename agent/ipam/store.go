package ipam

// The IPAM's records as package ipamstore lays them on disk, in the
// IPAM's own types: what the group commit writes (write) and what New
// reads back (load).

import (
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/ring"
)

// allocRecord is a persisted attachment (ipamstore.Alloc).
type allocRecord ipamstore.Alloc

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

func putBlock(b *heldBlock) write { return ipamstore.PutBlock(b.record()) }

func deleteBlock(b *heldBlock) write { return ipamstore.DeleteBlock(b.record()) }

// record is a held block as the store keeps it.
func (b *heldBlock) record() ipamstore.Block {
	return ipamstore.Block{Overlay: b.Overlay, Family: b.Family, Bridge: b.Bridge, Prefix: b.Prefix, Origin: b.Origin,
		Donor: b.Donor, Version: b.Version, Recorded: b.Recorded}
}

// loaded is what the IPAM finds in the store when it starts.
type loaded struct {
	allocations map[string]map[ring.Attachment]allocRecord // by overlay
	blocks      map[string][]*heldBlock                    // by overlay
	granted     map[[2]string]netip.Prefix                 // (from, request id) -> block
	clusterID   string
	released    map[string]time.Time // allocKey -> release
}

// load creates the IPAM's buckets and reads what it persisted
// (ipamstore.Load). The rings themselves are read when their overlay is
// seeded (ringStore).
func load(db *bolt.DB) (loaded, error) {
	st, err := ipamstore.Load(db, releaseMemory)
	if err != nil {
		return loaded{}, err
	}
	out := loaded{allocations: map[string]map[ring.Attachment]allocRecord{}, blocks: map[string][]*heldBlock{},
		granted: st.Granted, clusterID: st.ClusterID, released: st.Released}
	for network, m := range st.Allocations {
		out.allocations[network] = make(map[ring.Attachment]allocRecord, len(m))
		for at, rec := range m {
			out.allocations[network][at] = allocRecord(rec)
		}
	}
	for overlay, bs := range st.Blocks {
		for _, b := range bs {
			out.blocks[overlay] = append(out.blocks[overlay], &heldBlock{Overlay: b.Overlay, Family: b.Family, Bridge: b.Bridge,
				Prefix: b.Prefix, Origin: b.Origin, Donor: b.Donor, Version: b.Version, Recorded: b.Recorded})
		}
	}
	return out, nil
}

// ringStore reads the persisted rings for a sync (ringDisk).
type ringStore ipamstore.RingStore

// errRingUnread marks a persisted ring that could not be read
// (ipamstore.ErrRingUnread).
var errRingUnread = ipamstore.ErrRingUnread

func (st ringStore) savedRing(overlay string, fam int) ([]byte, error) {
	return ipamstore.RingStore(st).SavedRing(overlay, fam)
}
