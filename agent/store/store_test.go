package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/membershiptest"
)

// rec is an unsigned record of agent id at version v with underlay ip.
func rec(id string, v uint64, ip string) membership.PeerRecord {
	return membership.NewPeerRecord(membershiptest.Agent(id, v, ip))
}

func TestStoreRoundTripAndID(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.LoadOrCreateID("", "--id")
	if err != nil || !strings.HasPrefix(id, "agent-") {
		t.Fatalf("id %q %v", id, err)
	}
	pub, priv := membershiptest.Key(t)
	p := State{ID: id, Self: membershiptest.SignedAgent(priv, "c1"), Network: &api.NetworkConfig{VNI: 7}, MasterIndex: 42, ClusterID: "c1", SigningKey: pub,
		RestoreEpoch: 2, RestoreFloor: 30, Horizon: 5,
		Membership: membership.State{Records: []membership.PeerRecord{membership.NewPeerRecord(membershiptest.SignedAgent(priv, "c1"))},
			Tombstones: []api.Tombstone{{AgentID: "gone", Version: 3, Signature: api.Sign(priv, []byte("x"))}}},
		FromMasters: []string{"b"}}
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	again, err := s.LoadOrCreateID("", "--id")
	if err != nil || again != id {
		t.Fatalf("id changed across restarts: %q -> %q (%v)", id, again, err)
	}
	if _, err := s.LoadOrCreateID("other", "--id"); err == nil {
		t.Error("a different --id on an existing data dir must be refused")
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if g, w := mustJSON(t, got), mustJSON(t, p); g != w {
		t.Errorf("loaded %s\nwant %s", g, w)
	}
}

// mustJSON is v's JSON encoding: what a round trip through the store keeps.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStoreLoadsLargeMembership: the local store holds whatever membership a
// large cluster has; the bound on gossip messages is not a bound on it.
func TestStoreLoadsLargeMembership(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Enough records to pass the limit by 1 MiB: counted from one record's
	// encoding (every record is about as long), checked once below, rather
	// than by encoding the growing state again and again.
	const want = membership.MaxMessageBytes + (1 << 20)
	one, err := json.Marshal(rec("agent-000000", 1, "198.18.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	var st membership.State
	for i := range want/len(one) + 1000 {
		st.Records = append(st.Records, rec(fmt.Sprintf("agent-%06d", i), uint64(i+1), fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)))
	}
	if b, err := json.Marshal(st); err != nil || len(b) <= want {
		t.Fatalf("%d records encode to %d bytes (err %v), want over %d", len(st.Records), len(b), err, want)
	}
	slices.SortFunc(st.Records, func(a, b membership.PeerRecord) int { return strings.Compare(a.ID, b.ID) })
	if err := s.Save(State{Membership: st, MasterIndex: 9}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatalf("load %d records: %v", len(st.Records), err)
	}
	if len(got.Membership.Records) != len(st.Records) || !reflect.DeepEqual(got.Membership, st) {
		t.Fatalf("loaded %d records, want %d", len(got.Membership.Records), len(st.Records))
	}
}

// TestStoreWritesWhatChanged: saving the membership after one record
// changed writes that record's entry and no other (a change costs what it
// is on disk, not the cluster's size), deletes the entry of an agent that
// left, and a restart loads exactly what was saved.
func TestStoreWritesWhatChanged(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var st membership.State
	for i := range 50 {
		st.Records = append(st.Records, rec(fmt.Sprintf("agent-%03d", i), uint64(i+1), fmt.Sprintf("198.18.1.%d", i+1)))
	}
	st.Tombstones = []api.Tombstone{{AgentID: "gone", Version: 7}}
	p := State{Membership: st, FromMasters: []string{"agent-001"}, MasterIndex: 9}
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	// A marker in an unchanged entry shows whether Save rewrites it.
	marker := []byte(`{"r":{"id":"agent-010","ip":"198.18.1.11","v":11},"m":false}`)
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte(membersBucket)).Put([]byte("agent-010"), marker) }); err != nil {
		t.Fatal(err)
	}
	st.Records[3] = rec("agent-003", 100, "198.18.1.200")
	st.Records = slices.Delete(st.Records, 20, 21) // agent-020 left
	p.Membership = st
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	get := func(id string) []byte {
		var v []byte
		_ = s.db.View(func(tx *bolt.Tx) error {
			v = slices.Clone(tx.Bucket([]byte(membersBucket)).Get([]byte(id)))
			return nil
		})
		return v
	}
	if !bytes.Equal(get("agent-010"), marker) {
		t.Error("an unchanged record was written again")
	}
	if get("agent-020") != nil {
		t.Error("the entry of an agent that left is still on disk")
	}
	if e := get("agent-003"); !bytes.Contains(e, []byte(`"v":100`)) {
		t.Errorf("the changed record was not written: %s", e)
	}
	// Without the marker, a restart loads what was saved.
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte(membersBucket)).Delete([]byte("agent-010")) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	st.Records = slices.DeleteFunc(st.Records, func(r membership.PeerRecord) bool { return r.ID == "agent-010" })
	if !reflect.DeepEqual(got.Membership, st) || !slices.Equal(got.FromMasters, []string{"agent-001"}) {
		t.Errorf("loaded %d records, %v tombstones, from masters %v; want %d, %v, [agent-001]",
			len(got.Membership.Records), got.Membership.Tombstones, got.FromMasters, len(st.Records), st.Tombstones)
	}
}

// TestStoreReadsEarlierMembership: a data dir written by an earlier
// version (the whole membership in one value) is read, and the first save
// replaces it with an entry per agent.
func TestStoreReadsEarlierMembership(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	st := membership.State{Records: []membership.PeerRecord{rec("a", 3, "198.18.0.1"), rec("b", 4, "198.18.0.2")},
		Tombstones: []api.Tombstone{{AgentID: "c", Version: 5}}}
	whole, _ := json.Marshal(st)
	origins, _ := json.Marshal([]string{"b"})
	if err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(agentBucket))
		return errors.Join(b.Put([]byte(keyMembers), whole), b.Put([]byte(keyMasters), origins))
	}); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		p, err := s.Load()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p.Membership, st) || !slices.Equal(p.FromMasters, []string{"b"}) {
			t.Fatalf("load %d: %+v from masters %v", round, p.Membership, p.FromMasters)
		}
		if err := s.Save(p); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(agentBucket)).Get([]byte(keyMembers)) != nil {
			t.Error("the earlier whole-membership value is still there")
		}
		if n := tx.Bucket([]byte(membersBucket)).Stats().KeyN; n != 3 {
			t.Errorf("%d membership entries, want 3", n)
		}
		return nil
	})
}
