package ipamstore

import (
	"maps"
	"math"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/ring"
)

func openDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "agent.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func noBlocks(key, _ []byte) error { return nil }

func apply(t *testing.T, db *bolt.DB, writes ...Write) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error { return Apply(tx, writes) }); err != nil {
		t.Fatal(err)
	}
}

// TestLoadReadsBack: what the writes put, Load reads back; a release
// older than the memory is forgotten, and deleted from disk.
func TestLoadReadsBack(t *testing.T) {
	db := openDB(t)
	if _, err := Load(db, time.Minute, noBlocks); err != nil { // the buckets
		t.Fatal(err)
	}
	at := ring.Attachment{ContainerID: "c1", Interface: "eth0"}
	rec := Alloc{Bridge: "mesos", V4: netip.MustParseAddr("10.128.0.5")}
	p := netip.MustParsePrefix("10.128.1.0/28")
	now := time.Now()
	apply(t, db, PutClusterID("c1"), PutAlloc("carve", at, rec), PutGranted("b", "b-1", p),
		PutReleased("fresh", now), PutReleased("old", now.Add(-time.Hour)), PutRing("carve", 0, []byte{1, 2}),
		PutBlock("carve", 0, p, []byte(`{}`)), PutOutbox(OutboxEntry{Kind: OutboxReturn, Prefix: p, RequestID: "r1"}))
	var blocks []string
	st, err := Load(db, time.Minute, func(k, _ []byte) error { blocks = append(blocks, string(k)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case st.ClusterID != "c1":
		t.Errorf("cluster id %q", st.ClusterID)
	case st.Allocations["carve"][at] != rec:
		t.Errorf("allocations %+v", st.Allocations)
	case st.Granted[[2]string{"b", "b-1"}] != p:
		t.Errorf("granted %+v", st.Granted)
	case len(st.Released) != 1 || st.Released["fresh"].UnixNano() != now.UnixNano():
		t.Errorf("released %+v, want only the fresh one", st.Released)
	case len(blocks) != 1 || blocks[0] != BlockKey("carve", 0, p):
		t.Errorf("blocks %v", blocks)
	}
	if saved, err := (RingStore{DB: db, Path: db.Path()}).SavedRing("carve", 0); err != nil || len(saved) != 2 {
		t.Errorf("saved ring %v, %v", saved, err)
	}
	if out, err := ReadOutbox(db); err != nil || len(out) != 1 || out[0].RequestID != "r1" {
		t.Errorf("outbox %+v, %v", out, err)
	}
	st, err = Load(db, time.Minute, noBlocks)
	if err != nil || len(st.Released) != 1 {
		t.Errorf("released after a second load: %+v, %v", st.Released, err)
	}
}

// TestLoadRefusesCorruptRecords: a record that does not decode fails the
// load, naming its key.
func TestLoadRefusesCorruptRecords(t *testing.T) {
	for _, tt := range []struct {
		name string
		w    Write
	}{
		{"allocation", Write{Bucket: AllocBucket, Key: "carve\x00c1\x00eth0", Value: []byte("{")}},
		{"allocation key", Write{Bucket: AllocBucket, Key: "carve", Value: []byte("{}")}},
		{"grant", Write{Bucket: GrantedBucket, Key: "b\x00b-1", Value: []byte("not a prefix")}},
		{"release", Write{Bucket: ReleasedBucket, Key: "k", Value: []byte{1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db := openDB(t)
			if _, err := Load(db, time.Minute, noBlocks); err != nil {
				t.Fatal(err)
			}
			apply(t, db, tt.w)
			if _, err := Load(db, time.Minute, noBlocks); err == nil {
				t.Fatal("a corrupt record loaded")
			}
		})
	}
}

// TestLoadReturned: the grown blocks given back load at their highest
// version, with the returns still in the outbox; one written before
// versions were, or a granted block's return to its donor (which names its
// lease to the masters only: LeaseVersion), counts for any lease of its
// block.
func TestLoadReturned(t *testing.T) {
	db := openDB(t)
	if _, err := Load(db, time.Minute, noBlocks); err != nil {
		t.Fatal(err)
	}
	p, q, r := netip.MustParsePrefix("10.128.1.0/28"), netip.MustParsePrefix("10.128.2.0/28"), netip.MustParsePrefix("10.128.3.0/28")
	apply(t, db, PutReturned(p, 7), PutOutbox(OutboxEntry{Kind: OutboxReturn, Prefix: p, RequestID: "r1", Version: 9}),
		PutOutbox(OutboxEntry{Kind: OutboxReturn, Prefix: q, RequestID: "r2", LeaseVersion: 5, RestoreEpoch: 2}),
		PutOutbox(OutboxEntry{Kind: OutboxGrant, Prefix: r, RequestID: "r3", Version: 3}))
	st, err := Load(db, time.Minute, noBlocks)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[netip.Prefix]uint64{p: 9, q: math.MaxUint64}; !maps.Equal(st.Returned, want) {
		t.Errorf("returned %v, want %v", st.Returned, want)
	}
}
