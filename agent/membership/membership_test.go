package membership

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/membershiptest"
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
		{"digest without sender", `{"ae":{"digest":7}}`},
		{"buckets not 8-byte", `{"ae":{"buckets":"AAAA"}}`},
		{"buckets of 3", `{"ae":{"buckets":"` + base64.StdEncoding.EncodeToString(make([]byte, 24)) + `"}}`},
		{"buckets too many", `{"ae":{"buckets":"` + base64.StdEncoding.EncodeToString(make([]byte, 8*2*antientropy.MaxBuckets)) + `"}}`},
		{"push of 3 buckets", `{"ae":{"n":3,"push":[0]}}`},
		{"push bucket out of range", `{"ae":{"n":2,"push":[2]}}`},
		{"push bucket twice", `{"ae":{"n":2,"push":[1,1]}}`},
		{"push naming nothing", `{"ae":{"n":2}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode([]byte(tt.msg)); err == nil {
				t.Errorf("accepted %.80s", tt.msg)
			}
		})
	}
}

// TestLegacyAntiEntropyIgnored: a message of the anti-entropy protocol
// before (an agent not upgraded yet) decodes, marked Legacy, with its
// records kept (deltas still flow), and the handler counts it and answers
// nothing.
func TestLegacyAntiEntropyIgnored(t *testing.T) {
	r, _ := json.Marshal(rec("a", 3, "198.18.0.1"))
	for _, msg := range []string{
		`{"cluster_id":"c","from":"p","digest":"AAAAAAAAAAA=","records":[` + string(r) + `]}`,
		`{"cluster_id":"c","summary":{"n":2,"buckets":[0],"entries":[{"id":"a","v":9,"h":1}]},"records":[` + string(r) + `]}`,
		`{"cluster_id":"c","want":["a"],"records":[` + string(r) + `]}`,
	} {
		m, err := Decode([]byte(msg))
		if err != nil || !m.Legacy || len(m.Records) != 1 || m.AE != nil {
			t.Fatalf("%.60s: decoded %+v, %v; want legacy with its record", msg, m, err)
		}
		counted := map[string]int{}
		merged := 0
		h := NewHandler(HandlerConfig{Self: "self", Members: New(), ClusterID: func() string { return "c" },
			Merge:   func(m Message) gossip.Data { merged += len(m.Records); return nil },
			Unicast: func(string, []byte) error { t.Fatal("answered a legacy message"); return nil },
			Count:   func(e string) { counted[e]++ }})
		if err := h.OnUnicast("p", []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if counted[EventLegacy] != 1 || merged != 1 {
			t.Errorf("%.60s: counted %v, merged %d records; want legacy counted and the record merged", msg, counted, merged)
		}
	}
}
