package membership

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/carve-net/carve/agent/membership/membershiptest"
	"github.com/carve-net/carve/api"
)

// rec is membershiptest.Agent's record, as gossip carries it.
func rec(id string, v uint64, ip string) PeerRecord {
	return NewPeerRecord(membershiptest.Agent(id, v, ip))
}

func TestMembershipMergeRules(t *testing.T) {
	tests := []struct {
		name    string
		steps   []State
		wantIDs []string
		wantIP  string // of "a", when present
	}{
		{"newer record wins", []State{{Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}, {Records: []PeerRecord{rec("a", 9, "198.18.0.2")}}}, []string{"a"}, "198.18.0.2"},
		{"older record loses", []State{{Records: []PeerRecord{rec("a", 9, "198.18.0.2")}}, {Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}}, []string{"a"}, "198.18.0.2"},
		{"tombstone removes older record", []State{{Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}, {Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}}, nil, ""},
		{"late older gossip cannot resurrect", []State{{Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}, {Records: []PeerRecord{rec("a", 5, "198.18.0.1")}}}, nil, ""},
		{"tombstone at the same version wins", []State{{Records: []PeerRecord{rec("a", 7, "198.18.0.1")}}, {Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}}, nil, ""},
		{"re-registration after delete comes back", []State{{Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}}, {Records: []PeerRecord{rec("a", 8, "198.18.0.3")}}}, []string{"a"}, "198.18.0.3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New()
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
		var updates []State
		for range 30 {
			id := fmt.Sprintf("n%d", rng.IntN(6))
			v := uint64(rng.IntN(20) + 1)
			if rng.IntN(4) == 0 {
				updates = append(updates, State{Tombstones: []api.Tombstone{{AgentID: id, Version: v}}})
			} else {
				r := rec(id, v, fmt.Sprintf("198.18.0.%d", rng.IntN(3)+1))
				updates = append(updates, State{Records: []PeerRecord{r}})
			}
		}
		reference := New()
		for _, u := range updates {
			reference.Merge(u)
		}
		want := reference.State()
		for trial := range 5 {
			perm := rng.Perm(len(updates))
			a, b := New(), New()
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
	good, _ := json.Marshal(State{Records: []PeerRecord{rec("a", 1, "198.18.0.1")}})
	if _, err := Decode(good); err != nil {
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
		{"oversized", `{"records":[` + strings.Repeat(" ", MaxMessageBytes) + `]}`},
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
			if _, err := Decode([]byte(tt.msg)); err == nil {
				t.Errorf("accepted %.80s", tt.msg)
			}
		})
	}
}
