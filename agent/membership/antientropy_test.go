package membership

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestAntiEntropyConverges: whatever two memberships hold, one round each
// way leaves both with their join, exactly what merging the whole states
// gives; and a round between equal memberships sends the digest alone.
func TestAntiEntropyConverges(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		a, b := New(), New()
		nIDs := 1 + rng.IntN(200)
		for range rng.IntN(400) {
			id := fmt.Sprintf("n%d", rng.IntN(nIDs))
			v := uint64(rng.IntN(20) + 1)
			var st State
			if rng.IntN(4) == 0 {
				st.Tombstones = []api.Tombstone{{AgentID: id, Version: v}}
			} else {
				st.Records = []PeerRecord{rec(id, v, fmt.Sprintf("198.18.0.%d", rng.IntN(3)+1))}
			}
			switch rng.IntN(3) {
			case 0:
				a.Merge(st)
			case 1:
				b.Merge(st)
			default:
				a.Merge(st)
				b.Merge(st)
			}
		}
		join := New()
		join.Merge(a.State())
		join.Merge(b.State())
		want := join.State()
		AntiEntropyRound("c", "a", a, b)
		AntiEntropyRound("c", "b", b, a)
		for name, m := range map[string]*Membership{"a": a, "b": b} {
			if got := m.State(); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d: %s after anti-entropy\ngot  %+v\nwant %+v", seed, name, got, want)
			}
		}
		if r := AntiEntropyRound("c", "a", a, b); r.Messages != 1 || r.Summary+r.Want+r.Push != 0 {
			t.Fatalf("seed %d: a round between equal memberships sent %+v, want the digest alone", seed, r)
		}
	}
}

// bigMembership is n agents with realistic ids, addresses and signatures
// (random bytes: sizes are what is measured here, not trust).
func bigMembership(n int, rng *rand.Rand) *Membership {
	m := New()
	var st State
	for i := range n {
		st.Records = append(st.Records, scaleRecord(i, 100+uint64(i), rng))
	}
	m.Merge(st)
	return m
}

func scaleRecord(i int, v uint64, rng *rand.Rand) PeerRecord {
	sig := make([]byte, 64)
	for j := range sig {
		sig[j] = byte(rng.IntN(256))
	}
	ip := fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)
	return PeerRecord{ID: fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i), IP: ip, MeshAddr: ip + ":6783", Version: v,
		Signature: base64.StdEncoding.EncodeToString(sig),
		Overlays: []PeerOverlay{{Name: "carve", Subnet: fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256),
			VTEPIP: fmt.Sprintf("100.64.%d.%d/16", i/250, i%250+1), VTEPMAC: "70:b3:d5:40:00:02"}}}
}

// TestGossipSizesAtScale asserts the sizes (deterministic, not times) of
// membership gossip at 1,000 and 5,000 agents: a change is broadcast as a
// delta of about one record, a round of anti-entropy between agents that
// agree is a digest of at most 2 KiB and a few hundred bytes of JSON, and
// one that differs by a record costs a few KiB, where the whole membership
// (what every periodic gossip used to carry) is hundreds of KiB.
func TestGossipSizesAtScale(t *testing.T) {
	for _, n := range []int{1000, 5000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			a := bigMembership(n, rand.New(rand.NewPCG(1, uint64(n))))
			b := New()
			b.Merge(a.State())
			whole := len(membershipData{clusterID: "c", st: a.State()}.Encode()[0])
			changed := scaleRecord(n/2, 100+uint64(n/2)+1000, rand.New(rand.NewPCG(2, 2)))
			delta := len(membershipData{clusterID: "c", st: State{Records: []PeerRecord{changed}}}.Encode()[0])
			equal := AntiEntropyRound("c", "a", a, b)
			a.Merge(State{Records: []PeerRecord{changed}})
			oneOff := AntiEntropyRound("c", "a", a, b)
			after := AntiEntropyRound("c", "a", a, b)
			t.Logf("%d agents: whole state %d B; delta %d B; anti-entropy round: equal %+v, one record off %+v (total %d B)",
				n, whole, delta, equal, oneOff, oneOff.Total())
			if whole < 100*n {
				t.Errorf("whole state %d B: the baseline is wrong", whole)
			}
			if delta > 1024 {
				t.Errorf("delta of one change: %d B, want at most 1 KiB", delta)
			}
			if equal.Messages != 1 || equal.Digest > 3*1024 {
				t.Errorf("round between equal memberships: %+v, want one digest of at most 3 KiB", equal)
			}
			if oneOff.Total() > 8*1024 || oneOff.Push > 2*1024 {
				t.Errorf("round with one record off: %+v (total %d B), want at most 8 KiB and a push of one record", oneOff, oneOff.Total())
			}
			if !reflect.DeepEqual(a.State(), b.State()) || after.Messages != 1 {
				t.Errorf("after the round the memberships differ (next round %+v)", after)
			}
		})
	}
}

// TestAnswerSummaryBounds: a summary that claims every id of a large
// membership is old gets a push in bounded messages, and a digest of a
// peer that knows nothing a summary within maxSummaryEntries.
func TestAnswerSummaryBounds(t *testing.T) {
	a := bigMembership(3000, rand.New(rand.NewPCG(3, 3)))
	empty := New()
	sum := a.AnswerDigest(empty.Digest(0))
	if sum == nil || len(sum.Entries) != 3000 {
		t.Fatalf("summary for an empty peer: %v entries, want 3000", sum)
	}
	push, want := a.AnswerSummary(&DigestSummary{N: sum.N, Buckets: sum.Buckets})
	if len(want) != 0 || len(push.Records) != 3000 {
		t.Fatalf("push to a peer that lacks everything: %d records, want %d ids", len(push.Records), len(want))
	}
	for _, c := range Chunks(push) {
		if n := len(c.Records) + len(c.Tombstones); n > maxPushRecords {
			t.Fatalf("a push chunk of %d records", n)
		}
		if b := len(Encode(Message{ClusterID: "c", State: c})); b > 256*1024 {
			t.Fatalf("a push message of %d bytes", b)
		}
	}
	if s := a.AnswerDigest([]byte("not a digest")); s != nil {
		t.Fatalf("a malformed digest was answered: %+v", s)
	}
}

// FuzzDecodeAntiEntropy: anti-entropy messages from the network never
// panic the decoder or the answers, and what is answered is bounded.
func FuzzDecodeAntiEntropy(f *testing.F) {
	m := New()
	m.Merge(State{Records: []PeerRecord{rec("a", 3, "198.18.0.1"), rec("b", 4, "198.18.0.2")},
		Tombstones: []api.Tombstone{{AgentID: "c", Version: 5}}})
	d, _ := json.Marshal(Message{ClusterID: "c", From: "x", Digest: New().Digest(4)})
	f.Add(d)
	s, _ := json.Marshal(Message{ClusterID: "c", Summary: m.AnswerDigest(New().Digest(2))})
	f.Add(s)
	f.Add([]byte(`{"cluster_id":"c","want":["a","c","zz"]}`))
	f.Add([]byte(`{"summary":{"n":2,"buckets":[0,1],"entries":[{"id":"a","v":9,"h":1},{"id":"q","t":2,"h":3}]}}`))
	f.Add([]byte(`{"from":"p","digest":"AAAAAAAAAAA="}`))
	f.Add([]byte(`{"summary":{"n":3,"buckets":[7]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := Decode(data)
		if err != nil {
			return
		}
		if msg.Digest != nil {
			if s := m.AnswerDigest(msg.Digest); s != nil && len(s.Entries) > maxSummaryEntries {
				t.Fatalf("summary of %d entries", len(s.Entries))
			}
		}
		if msg.Summary != nil {
			push, want := m.AnswerSummary(msg.Summary)
			if len(want) > maxWant || len(push.Records) > 2 {
				t.Fatalf("answer to a summary: push %d, want %d", len(push.Records), len(want))
			}
		}
		_ = m.Lookup(msg.Want)
	})
}

// TestDigestFollowsEveryChange: the digest is cached while nothing
// changes, so every way the records and tombstones change (merges from
// gossip and from the masters, a record replaced at an equal version,
// tombstones, compaction, a whole master state that drops records, a
// reset) must show in the next digest. After each random step, read
// before and after it (so that a stale cache would be served), the
// digests and the answer to another membership's digest equal those of a
// membership built afresh from the same state.
func TestDigestFollowsEveryChange(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		m := New()
		other := New()
		var horizon uint64
		for step := range 60 {
			id := fmt.Sprintf("n%d", rng.IntN(30))
			v := uint64(rng.IntN(40) + 1)
			ip := fmt.Sprintf("198.18.0.%d", rng.IntN(3)+1)
			var what string
			switch op := rng.IntN(8); op {
			case 0, 1:
				what = "merge"
				m.Merge(State{Records: []PeerRecord{rec(id, v, ip)}})
			case 2:
				what = "merge from the masters"
				m.MergeFromMasters(State{Records: []PeerRecord{rec(id, v, ip)}})
			case 3:
				// The masters' copy at the same version, another content.
				what = "replace at an equal version"
				if r, ok := m.Record(id); ok {
					m.MergeFromMasters(State{Records: []PeerRecord{rec(id, r.Version, fmt.Sprintf("198.18.1.%d", rng.IntN(250)+1))}})
				}
			case 4:
				what = "tombstone"
				m.Merge(State{Tombstones: []api.Tombstone{{AgentID: id, Version: v}}})
			case 5:
				what = "compact"
				horizon += uint64(rng.IntN(6))
				m.Compact(horizon)
			case 6:
				what = "sync with the masters"
				held := map[string]bool{}
				for _, r := range m.State().Records {
					if rng.IntN(3) > 0 {
						held[r.ID] = true
					}
				}
				horizon += uint64(rng.IntN(6))
				m.SyncWithMasters(held, horizon)
			case 7:
				if rng.IntN(4) > 0 {
					continue
				}
				what, horizon = "reset", 0
				m.Reset()
			}
			other.Merge(State{Records: []PeerRecord{rec(fmt.Sprintf("n%d", rng.IntN(30)), uint64(rng.IntN(40)+1), ip)}})
			ref := New()
			ref.Merge(m.State())
			for _, n := range []int{0, 4, 16} {
				if got, want := m.Digest(n), ref.Digest(n); !reflect.DeepEqual(got, want) {
					t.Fatalf("seed %d, step %d (%s): Digest(%d) = %x, afresh %x", seed, step, what, n, got, want)
				}
			}
			if got, want := m.AnswerDigest(other.Digest(4)), ref.AnswerDigest(other.Digest(4)); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d, step %d (%s): the answer to a digest is %+v, afresh %+v", seed, step, what, got, want)
			}
		}
	}
}

// TestDigestForgetsDroppedRecord: a record dropped (here by a whole master
// state past the horizon) leaves the digest, also while another id has
// both a record and a tombstone. It stayed in before (the entries were
// pruned only when they outnumbered records plus tombstones), and the
// digest then never matched a peer's.
func TestDigestForgetsDroppedRecord(t *testing.T) {
	m := New()
	m.Merge(State{Tombstones: []api.Tombstone{{AgentID: "a", Version: 7}}})
	m.Merge(State{Records: []PeerRecord{rec("a", 9, "198.18.0.1"), rec("b", 5, "198.18.0.2")}})
	m.Digest(0)
	if dropped := m.SyncWithMasters(map[string]bool{"a": true}, 6); !reflect.DeepEqual(dropped, []string{"b"}) {
		t.Fatalf("dropped %v, want [b]", dropped)
	}
	ref := New()
	ref.Merge(m.State())
	if got, want := m.Digest(0), ref.Digest(0); !reflect.DeepEqual(got, want) {
		t.Fatalf("after b was dropped the digest is %x, afresh %x", got, want)
	}
	if r := AntiEntropyRound("c", "m", m, ref); r.Messages != 1 {
		t.Fatalf("a round with an equal membership sent %+v, want the digest alone", r)
	}
}
