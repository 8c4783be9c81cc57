package agent

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
)

func rec(id string, v uint64, ip string) PeerRecord {
	return PeerRecord{ID: id, IP: ip, Version: v, MeshAddr: ip + ":6783", Overlays: []PeerOverlay{{Name: "carve",
		Subnet: "10.128.2.0/24", MesosIP: "10.128.2.0/25", DockerIP: "10.128.2.128/25", VTEPIP: "100.64.0.2/16", VTEPMAC: "70:b3:d5:40:00:02"}}}
}

func TestMembershipMergeRules(t *testing.T) {
	tests := []struct {
		name    string
		steps   []MembershipState
		wantIDs []string
		wantIP  string // of "a", when present
	}{
		{"newer record wins", []MembershipState{{Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}, {Records: []PeerRecord{rec("a", 9, "198.18.0.2")}}}, []string{"a"}, "198.18.0.2"},
		{"older record loses", []MembershipState{{Records: []PeerRecord{rec("a", 9, "198.18.0.2")}}, {Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}}, []string{"a"}, "198.18.0.2"},
		{"tombstone removes older record", []MembershipState{{Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}, {Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}}, nil, ""},
		{"late older gossip cannot resurrect", []MembershipState{{Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}, {Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}}, nil, ""},
		{"tombstone at the same version wins", []MembershipState{{Records: []PeerRecord{rec("a", 7, "198.18.0.1")}}, {Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}}, nil, ""},
		{"re-registration after delete comes back", []MembershipState{{Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}, {Records: []PeerRecord{rec("a", 8, "198.18.0.3")}}}, []string{"a"}, "198.18.0.3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMembership()
			for _, s := range tt.steps {
				m.Merge(s)
			}
			st := m.State()
			var ids []string
			for _, r := range st.Records {
				ids = append(ids, r.ID)
			}
			if fmt.Sprint(ids) != fmt.Sprint(tt.wantIDs) {
				t.Fatalf("records %v, want %v", ids, tt.wantIDs)
			}
			if r, ok := m.Record("a"); ok && r.IP != tt.wantIP {
				t.Errorf("a has ip %s, want %s", r.IP, tt.wantIP)
			}
		})
	}
}

// TestMembershipMergeIsAJoin: any order of the same updates, with
// duplicates, and any grouping, gives the same membership.
func TestMembershipMergeIsAJoin(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		var updates []MembershipState
		for range 30 {
			id := fmt.Sprintf("n%d", rng.IntN(6))
			v := uint64(rng.IntN(20) + 1)
			if rng.IntN(4) == 0 {
				updates = append(updates, MembershipState{Tombstones: []api.Tombstone{{AgentID: id, Version: v}}})
			} else {
				r := rec(id, v, fmt.Sprintf("198.18.0.%d", rng.IntN(3)+1))
				updates = append(updates, MembershipState{Records: []PeerRecord{r}})
			}
		}
		reference := NewMembership()
		for _, u := range updates {
			reference.Merge(u)
		}
		want := reference.State()
		for trial := range 5 {
			perm := rng.Perm(len(updates))
			a, b := NewMembership(), NewMembership()
			for i, p := range perm {
				// split between two peers, with duplicates, then merge one into the other
				if i%2 == 0 || rng.IntN(3) == 0 {
					a.Merge(updates[p])
				} else {
					b.Merge(updates[p])
				}
			}
			a.Merge(b.State())
			a.Merge(b.State()) // idempotent
			if got := a.State(); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d trial %d: merge order changed the result\ngot  %+v\nwant %+v", seed, trial, got, want)
			}
		}
	}
}

func TestDecodeMembershipRejects(t *testing.T) {
	good, _ := json.Marshal(MembershipState{Records: []PeerRecord{rec("a", 1, "198.18.0.1")}})
	if _, err := DecodeMembership(good); err != nil {
		t.Fatalf("good message refused: %v", err)
	}
	tests := []struct{ name, msg string }{
		{"not json", `{`},
		{"bad id", `{"records":[{"id":"a b","v":1}]}`},
		{"zero version", `{"records":[{"id":"a","v":0}]}`},
		{"bad ip", `{"records":[{"id":"a","v":1,"ip":"1.2.3"}]}`},
		{"bad mesh", `{"records":[{"id":"a","v":1,"mesh":"nohost"}]}`},
		{"bad vtep", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve","vtep":"fd00::1/64","mac":"70:b3:d5:40:00:02"}]}]}`},
		{"bad mac", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve","vtep":"100.64.0.2/16","mac":"zz"}]}]}`},
		{"mac without vtep", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve","mac":"70:b3:d5:40:00:02"}]}]}`},
		{"host bits subnet", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve","subnet":"10.0.0.1/24"}]}]}`},
		{"bad bridge", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve","mesos_ip":"10.0.0.1"}]}]}`},
		{"bad overlay name", `{"records":[{"id":"a","v":1,"overlays":[{"name":"Carve!"}]}]}`},
		{"bad vtep6", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve","vtep":"100.64.0.2/16","mac":"70:b3:d5:40:00:02","vtep6":"100.64.0.2/16"}]}]}`},
		{"overlay twice", `{"records":[{"id":"a","v":1,"overlays":[{"name":"carve"},{"name":"carve"}]}]}`},
		{"huge signature", `{"records":[{"id":"a","v":1,"sig":"` + strings.Repeat("A", 200) + `"}]}`},
		{"huge tombstone signature", `{"tombstones":[{"agent_id":"a","version":3,"signature":"` + strings.Repeat("A", 200) + `"}]}`},
		{"bad tombstone", `{"tombstones":[{"agent_id":"","version":3}]}`},
		{"oversized", `{"records":[` + strings.Repeat(" ", maxGossipBytes) + `]}`},
		{"digest not 8-byte buckets", `{"from":"p","digest":"AAAA"}`},
		{"digest of 3 buckets", `{"from":"p","digest":"` + base64.StdEncoding.EncodeToString(make([]byte, 24)) + `"}`},
		{"digest too long", `{"from":"p","digest":"` + base64.StdEncoding.EncodeToString(make([]byte, 8*2*maxDigestBuckets)) + `"}`},
		{"digest without sender", `{"digest":"AAAAAAAAAAA="}`},
		{"summary not a power of two", `{"summary":{"n":3,"buckets":[0]}}`},
		{"summary bucket out of range", `{"summary":{"n":2,"buckets":[2]}}`},
		{"summary bad id", `{"summary":{"n":2,"buckets":[0],"entries":[{"id":"a b","h":1}]}}`},
		{"want bad id", `{"want":["a b"]}`},
		{"want too long", `{"want":[` + strings.TrimSuffix(strings.Repeat(`"a",`, maxWant+1), ",") + `]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeMembership([]byte(tt.msg)); err == nil {
				t.Errorf("accepted %.80s", tt.msg)
			}
		})
	}
}

// FuzzDecodeMembership: remote gossip never panics the decoder, and what it
// accepts merges and yields a usable desired state.
func FuzzDecodeMembership(f *testing.F) {
	good, _ := json.Marshal(MembershipState{Records: []PeerRecord{rec("a", 1, "198.18.0.1")},
		Tombstones: []api.Tombstone{{AgentID: "b", Version: 4}}})
	f.Add(good)
	f.Add([]byte(`{"records":[{"id":"a","v":1,"ip":"fd00::1","overlays":[{"name":"six","status":"STATUS_OK","subnet6":"fd00:1::/64","vtep":"100.64.0.3/16","mac":"70:b3:d5:40:00:03"}]}]}`))
	f.Add([]byte(`{"records":[{"id":"a","v":3,"ip":"198.18.0.1","overlays":[{"name":"carve","status":"STATUS_OK","subnet":"10.128.0.0/24","vtep":"100.64.0.1/16","mac":"70:b3:d5:40:00:01","blocks":[{"bridge":"mesos","prefix":"10.128.0.0/25","origin":"lease","version":2},{"bridge":"mesos","prefix":"10.128.9.64/26","origin":"grant","donor":"b","version":3}]}]}]}`))
	f.Add([]byte(`{"records":[{"id":"a","v":3,"overlays":[{"name":"carve","blocks":[{"bridge":"x","prefix":"10.128.0.1/25","origin":"?"}]}]}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := DecodeMembership(data)
		if err != nil {
			return
		}
		m := NewMembership()
		m.Merge(st.MembershipState)
		_, _, _ = desiredState(selfInfo(), nil, netip.MustParseAddr("198.18.0.10"), m.State())
	})
}

func selfInfo() *api.AgentInfo {
	return &api.AgentInfo{AgentID: "self", IP: "198.18.0.10", Version: 3, Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve"},
		Subnet:       "10.128.0.0/24",
		MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: "10.128.0.0/25"},
		DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: "10.128.0.128/25", IP6: "fd00::8000:0:0:0/65"},
		Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VNI: 1024, VTEPName: "vtep1024", VTEPIP: "100.64.0.1/16",
			VTEPMAC: "70:b3:d5:40:00:01", VTEPPort: 4789, VTEPMTU: 1450}},
		State: api.OverlayState{Status: api.StatusOK},
	}}}
}

func TestDesiredState(t *testing.T) {
	members := MembershipState{Records: []PeerRecord{
		NewPeerRecord(selfInfo()), // self is never a peer
		rec("b", 4, "198.18.0.11"),
		{ID: "no-ip", Version: 5, Overlays: []PeerOverlay{{Name: "carve", VTEPIP: "100.64.0.9/16", VTEPMAC: "70:b3:d5:40:00:09"}}}, // lost its IP: skipped
	}}
	want, peers, err := desiredState(selfInfo(), &api.NetworkConfig{OverlayMTU: 1400}, netip.MustParseAddr("198.18.0.10"), members)
	if err != nil {
		t.Fatal(err)
	}
	if want.VTEP.Name != "vtep1024" || want.VTEP.VNI != 1024 || want.VTEP.Address.String() != "100.64.0.1/16" ||
		want.VTEP.MAC.String() != "70:b3:d5:40:00:01" || want.VTEP.Local.String() != "198.18.0.10" || want.VTEP.MTU != 1450 {
		t.Errorf("vtep %+v", want.VTEP)
	}
	wantBridges := []vxlan.Bridge{
		{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.0.1/25"), MTU: 1400},
		{Name: "d-carve", Gateway: netip.MustParsePrefix("10.128.0.129/25"), Gateway6: netip.MustParsePrefix("fd00::8000:0:0:1/65"), MTU: 1400},
	}
	if !reflect.DeepEqual(want.Bridges, wantBridges) {
		t.Errorf("bridges %+v", want.Bridges)
	}
	if !want.IPForward || !want.IPv6Forward {
		t.Errorf("forwarding %v %v", want.IPForward, want.IPv6Forward)
	}
	if len(want.Peers) != 1 || want.Peers[0].ID != "b" || want.Peers[0].VTEPIP.String() != "100.64.0.2" ||
		want.Peers[0].Subnets[0].String() != "10.128.2.0/24" || peers["b"] != 4 || len(peers) != 1 {
		t.Errorf("peers %+v %v", want.Peers, peers)
	}
	if _, _, err := desiredState(&api.AgentInfo{AgentID: "x"}, nil, netip.MustParseAddr("198.18.0.10"), members); err == nil {
		t.Error("a record without VTEP should be an error")
	}
}

func TestStoreRoundTripAndID(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.LoadOrCreateID("", "--id")
	if err != nil || !strings.HasPrefix(id, "agent-") {
		t.Fatalf("id %q %v", id, err)
	}
	pub, priv := testKey(t)
	p := persisted{ID: id, Self: selfInfo(), Network: &api.NetworkConfig{VNI: 7}, MasterIndex: 42, ClusterID: "c1", SigningKey: pub,
		Membership: MembershipState{Records: []PeerRecord{signedPeer(priv, "c1")},
			Tombstones: []api.Tombstone{{AgentID: "gone", Version: 3, Signature: api.Sign(priv, []byte("x"))}}},
		FromMasters: []string{"b"}}
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenStore(dir)
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
	if !jsonEqual(got, p) {
		t.Errorf("loaded %+v\nwant %+v", got, p)
	}
}

// TestStoreLoadsLargeMembership: the local store holds whatever membership a
// large cluster has; the bound on gossip messages is not a bound on it.
func TestStoreLoadsLargeMembership(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var st MembershipState
	for i := 0; ; i++ {
		st.Records = append(st.Records, rec(fmt.Sprintf("agent-%06d", i), uint64(i+1), fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)))
		if i%1000 == 0 {
			if b, _ := json.Marshal(st); len(b) > maxGossipBytes+(1<<20) {
				break
			}
		}
	}
	slices.SortFunc(st.Records, func(a, b PeerRecord) int { return strings.Compare(a.ID, b.ID) })
	if err := s.Save(persisted{Membership: st, MasterIndex: 9}); err != nil {
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

// TestIPAMViewHasOwnLease: the IPAM serves addresses from the agent's own
// leases, which it finds among the view's peers. The agent's own record
// joins the membership only once it verifies (after the first master
// state), and a newer one may be pending there; the view carries the
// record the agent runs with in any case.
func TestIPAMViewHasOwnLease(t *testing.T) {
	self := selfInfo()
	older := NewPeerRecord(self)
	older.Version, older.Overlays[0].Subnet = self.Version-1, "10.128.9.0/24"
	tests := []struct {
		name    string
		members MembershipState
	}{
		{"own record not in the membership yet", MembershipState{Records: []PeerRecord{rec("b", 4, "198.18.0.11")}}},
		{"an older own record in the membership", MembershipState{Records: []PeerRecord{older, rec("b", 4, "198.18.0.11")}}},
		{"the same own record in the membership", MembershipState{Records: []PeerRecord{NewPeerRecord(self), rec("b", 4, "198.18.0.11")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := ipamView("c1", self, nil, tt.members, 0)
			var own []string
			for _, p := range v.Peers {
				if p.ID == self.AgentID {
					own = append(own, fmt.Sprintf("%d %v", p.Version, p.Subnets))
				}
			}
			if want := fmt.Sprintf("%d [10.128.0.0/24]", self.Version); len(own) != 1 || own[0] != want {
				t.Errorf("own leases in the IPAM's view: %v, want [%s]", own, want)
			}
			if len(v.Peers) != 2 {
				t.Errorf("view peers %+v", v.Peers)
			}
		})
	}
}

// TestStoreWritesWhatChanged: saving the membership after one record
// changed writes that record's entry and no other (a change costs what it
// is on disk, not the cluster's size), deletes the entry of an agent that
// left, and a restart loads exactly what was saved.
func TestStoreWritesWhatChanged(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var st MembershipState
	for i := range 50 {
		st.Records = append(st.Records, rec(fmt.Sprintf("agent-%03d", i), uint64(i+1), fmt.Sprintf("198.18.1.%d", i+1)))
	}
	st.Tombstones = []api.Tombstone{{AgentID: "gone", Version: 7}}
	p := persisted{Membership: st, FromMasters: []string{"agent-001"}, MasterIndex: 9}
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
	if s, err = OpenStore(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	st.Records = slices.DeleteFunc(st.Records, func(r PeerRecord) bool { return r.ID == "agent-010" })
	if !reflect.DeepEqual(got.Membership, st) || !slices.Equal(got.FromMasters, []string{"agent-001"}) {
		t.Errorf("loaded %d records, %v tombstones, from masters %v; want %d, %v, [agent-001]",
			len(got.Membership.Records), got.Membership.Tombstones, got.FromMasters, len(st.Records), st.Tombstones)
	}
}

// TestStoreReadsEarlierMembership: a data dir written by an earlier
// version (the whole membership in one value) is read, and the first save
// replaces it with an entry per agent.
func TestStoreReadsEarlierMembership(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	st := MembershipState{Records: []PeerRecord{rec("a", 3, "198.18.0.1"), rec("b", 4, "198.18.0.2")},
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
