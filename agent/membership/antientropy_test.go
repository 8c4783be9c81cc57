package membership

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/fakegossip"
)

// pair is two memberships, "a" and "b", each behind the real gossip
// handler on a fake network, merging what they receive without checks;
// sent counts what each sends, by kind.
type pair struct {
	t       *testing.T
	gnet    *fakegossip.Network
	members map[string]*Membership
	h       map[string]*Handler
	ch      map[string]gossip.Channel
	mu      sync.Mutex
	bytes   map[string]int
	msgs    map[string]int
}

func newPair(t *testing.T, seed uint64, a, b *Membership) *pair {
	t.Helper()
	p := &pair{t: t, gnet: fakegossip.New(fakegossip.Config{Seed: seed}), members: map[string]*Membership{"a": a, "b": b},
		h: map[string]*Handler{}, ch: map[string]gossip.Channel{}, bytes: map[string]int{}, msgs: map[string]int{}}
	t.Cleanup(p.gnet.Close)
	for id, m := range p.members {
		r, err := p.gnet.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		p.h[id] = NewHandler(HandlerConfig{Self: id, Members: m, ClusterID: func() string { return "c" },
			Merge: func(msg Message) gossip.Data {
				if news := m.Merge(msg.State); len(news.Records)+len(news.Tombstones) > 0 {
					return DeltaData("c", news, nil)
				}
				return nil
			},
			Unicast: func(dst string, b []byte) error { return p.ch[id].Unicast(dst, b) },
			Sent: func(kind string, n int) {
				p.mu.Lock()
				defer p.mu.Unlock()
				p.bytes[kind] += n
				p.msgs[kind]++
			}})
		if p.ch[id], err = r.Channel("members", p.h[id]); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// round runs one anti-entropy round started by from's digest and returns
// the bytes and messages of it, by kind.
func (p *pair) round(from string) (bytes, msgs map[string]int) {
	p.t.Helper()
	p.mu.Lock()
	p.bytes, p.msgs = map[string]int{}, map[string]int{}
	p.mu.Unlock()
	p.ch[from].Gossip(p.h[from].Gossip())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.gnet.WaitIdle(ctx); err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes, p.msgs
}

func total(b map[string]int) int {
	n := 0
	for _, v := range b {
		n += v
	}
	return n
}

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
		p := newPair(t, seed, a, b)
		p.round("a")
		p.round("b")
		for name, m := range map[string]*Membership{"a": a, "b": b} {
			if got := m.State(); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d: %s after anti-entropy\ngot  %+v\nwant %+v", seed, name, got, want)
			}
		}
		if b, n := p.round("a"); total(n) != 1 || n["digest"] != 1 {
			t.Fatalf("seed %d: a round between equal memberships sent %v in %v, want the digest alone", seed, b, n)
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
			p := newPair(t, 1, a, b)
			equal, equalN := p.round("a")
			a.Merge(State{Records: []PeerRecord{changed}})
			oneOff, oneOffN := p.round("a")
			_, after := p.round("a")
			t.Logf("%d agents: whole state %d B; delta %d B; anti-entropy round: equal %v, one record off %v in %v (total %d B)",
				n, whole, delta, equal, oneOff, oneOffN, total(oneOff))
			if whole < 100*n {
				t.Errorf("whole state %d B: the baseline is wrong", whole)
			}
			if delta > 1024 {
				t.Errorf("delta of one change: %d B, want at most 1 KiB", delta)
			}
			// The digest is 8 bytes now (2 KiB of bucket hashes before).
			if total(equalN) != 1 || equal["digest"] > 200 {
				t.Errorf("round between equal memberships: %v, want one digest of at most 200 B", equal)
			}
			// The push is the changed record's bucket (about 16 records,
			// one record and a summary before): at most 16 KiB in all.
			if total(oneOff) > 16*1024 || oneOffN["push"] != 1 || oneOff["push"] > 12*1024 {
				t.Errorf("round with one record off: %v in %v (total %d B), want at most 16 KiB and one push of a bucket", oneOff, oneOffN, total(oneOff))
			}
			if !reflect.DeepEqual(a.State(), b.State()) || total(after) != 1 {
				t.Errorf("after the round the memberships differ (next round %v)", after)
			}
		})
	}
}

// TestPushBounds: bucket hashes of a peer that knows nothing are answered
// with every record, in messages of at most maxPushRecords (each naming
// the buckets it holds whole), and the push back of a peer that holds
// everything newer is bounded the same way.
func TestPushBounds(t *testing.T) {
	a := bigMembership(3000, rand.New(rand.NewPCG(3, 3)))
	empty := New()
	theirs := empty.Buckets(len(a.Buckets(0)))
	pushes := a.AnswerBuckets(theirs)
	got, named := 0, 0
	for _, p := range pushes {
		if k := len(p.Records) + len(p.Tombstones); k > maxPushRecords {
			t.Fatalf("a push of %d records", k)
		}
		if b := len(Encode(Message{ClusterID: "c", State: p.State, AE: &AntiEntropy{N: p.N, Push: p.Buckets}})); b > 256*1024 {
			t.Fatalf("a push message of %d bytes", b)
		}
		got += len(p.Records)
		named += len(p.Buckets)
	}
	if got != 3000 || named != len(theirs) {
		t.Fatalf("push to a peer that lacks everything: %d records naming %d buckets, want 3000 and %d", got, named, len(theirs))
	}
	// The empty peer merged nothing (say, all refused): it pushes back
	// nothing; a itself, asked to push back what it was pushed, neither.
	if back := empty.PushBack(pushes[0].State, pushes[0].N, pushes[0].Buckets); back != nil {
		t.Fatalf("a push back of what the pusher holds: %v", back)
	}
	if back := a.PushBack(pushes[0].State, pushes[0].N, pushes[0].Buckets); back != nil {
		t.Fatalf("a push back between equal buckets: %d", len(back))
	}
}

// FuzzDecodeAntiEntropy: anti-entropy messages from the network (of this
// protocol and of the one before) never panic the decoder or the handler,
// and what is answered is bounded.
func FuzzDecodeAntiEntropy(f *testing.F) {
	m := New()
	m.Merge(State{Records: []PeerRecord{rec("a", 3, "198.18.0.1"), rec("b", 4, "198.18.0.2")},
		Tombstones: []api.Tombstone{{AgentID: "c", Version: 5}}})
	d := uint64(7)
	for _, msg := range []Message{
		{ClusterID: "c", From: "x", AE: &AntiEntropy{Digest: &d}},
		{ClusterID: "c", AE: &AntiEntropy{Buckets: New().Buckets(4).Encode()}},
		{ClusterID: "c", State: State{Records: []PeerRecord{rec("a", 9, "198.18.0.3")}}, AE: &AntiEntropy{N: 2, Push: []int{0, 1}}},
		{ClusterID: "c", AE: &AntiEntropy{N: 4, Push: []int{3}}},
	} {
		b, _ := json.Marshal(msg)
		f.Add(b)
	}
	f.Add([]byte(`{"ae":{"n":3,"push":[7]}}`))
	f.Add([]byte(`{"cluster_id":"c","ae":{"buckets":"AAAA"}}`))
	// The protocol before: ignored (Legacy), its records merged.
	f.Add([]byte(`{"cluster_id":"c","want":["a","c","zz"]}`))
	f.Add([]byte(`{"summary":{"n":2,"buckets":[0,1],"entries":[{"id":"a","v":9,"h":1},{"id":"q","t":2,"h":3}]}}`))
	f.Add([]byte(`{"from":"p","digest":"AAAAAAAAAAA="}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := Decode(data)
		if err != nil {
			return
		}
		if ae := msg.AE; ae != nil && ae.Buckets != nil {
			if theirs, err := antientropy.DecodeBuckets(ae.Buckets); err == nil {
				for _, p := range m.AnswerBuckets(theirs) {
					if len(p.Records)+len(p.Tombstones) > maxPushRecords {
						t.Fatalf("a push of %d", len(p.Records)+len(p.Tombstones))
					}
				}
			}
		}
		if ae := msg.AE; ae != nil && ae.N > 0 {
			_ = m.PushBack(msg.State, ae.N, ae.Push)
		}
		// The whole message through the handler, as the router delivers it.
		h := NewHandler(HandlerConfig{Self: "self", Members: m.clone(), ClusterID: func() string { return "c" },
			Merge:   func(Message) gossip.Data { return nil },
			Unicast: func(string, []byte) error { return nil }})
		_, _ = h.OnGossip(data)
		_ = h.OnUnicast("peer", data)
	})
}

// clone is a copy of m.
func (m *Membership) clone() *Membership {
	c := New()
	c.Merge(m.State())
	return c
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
				if got, want := m.Buckets(n), ref.Buckets(n); !reflect.DeepEqual(got, want) {
					t.Fatalf("seed %d, step %d (%s): Buckets(%d) = %x, afresh %x", seed, step, what, n, got, want)
				}
			}
			if m.Digest() != ref.Digest() {
				t.Fatalf("seed %d, step %d (%s): digest %x, afresh %x", seed, step, what, m.Digest(), ref.Digest())
			}
			if got, want := m.AnswerBuckets(other.Buckets(4)), ref.AnswerBuckets(other.Buckets(4)); !reflect.DeepEqual(got, want) {
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
	m.Digest()
	if dropped := m.SyncWithMasters(map[string]bool{"a": true}, 6); !reflect.DeepEqual(dropped, []string{"b"}) {
		t.Fatalf("dropped %v, want [b]", dropped)
	}
	ref := New()
	ref.Merge(m.State())
	if got, want := m.Digest(), ref.Digest(); got != want {
		t.Fatalf("after b was dropped the digest is %x, afresh %x", got, want)
	}
	if b, n := newPair(t, 1, m, ref).round("a"); total(n) != 1 {
		t.Fatalf("a round with an equal membership sent %v in %v, want the digest alone", b, n)
	}
}
