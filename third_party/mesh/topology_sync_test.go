package mesh

import (
	"bytes"
	"maps"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"
)

func TestTopologySyncCodec(t *testing.T) {
	names := []PeerName{PeerNameFromBin([]byte{2, 0, 0, 0, 0, 1}), PeerNameFromBin([]byte{2, 0, 0, 0, 0, 2})}
	msgs := []topologySyncMsg{
		{kind: syncDigest, count: 5000, digest: 1<<64 - 1},
		{kind: syncBuckets, n: 4, hashes: []uint64{0, 1, 1 << 63, 7}},
		{kind: syncSummary, n: 4, buckets: []int{0, 3}, entries: []peerVersion{
			{name: names[0], uid: 9, version: 3, hasShortID: true}, {name: names[1]}}},
		{kind: syncWant, names: names},
	}
	for _, m := range msgs {
		b := m.encode()
		got, err := decodeTopologySync(b)
		if err != nil {
			t.Fatalf("kind %d: %v", m.kind, err)
		}
		if !bytes.Equal(got.encode(), b) {
			t.Fatalf("kind %d: %+v decoded as %+v", m.kind, m, got)
		}
	}
	bad := []struct {
		name string
		msg  []byte
	}{
		{"empty", nil},
		{"unknown kind", []byte{9}},
		{"digest cut short", []byte{syncDigest, 5, 0, 0, 0, 0, 0, 0, 0}},
		{"trailing bytes", append(msgs[0].encode(), 0)},
		{"zero buckets", []byte{syncBuckets, 0}},
		{"three buckets", append([]byte{syncBuckets, 3}, make([]byte, 24)...)},
		{"too many buckets", []byte{syncBuckets, 0x80, 0x04}},
		{"buckets cut short", append([]byte{syncBuckets, 4}, make([]byte, 31)...)},
		{"summary bucket out of range", []byte{syncSummary, 4, 1, 4, 0}},
		{"summary claims more buckets than exist", []byte{syncSummary, 2, 3, 0, 1, 0, 0}},
		{"summary entry cut short", []byte{syncSummary, 1, 0, 1, 6, 2, 0}},
		{"summary entry bad flag", append(topologySyncMsg{kind: syncSummary, n: 1, entries: []peerVersion{{name: names[0]}}}.encode()[:11], 2)},
		{"want name too long", []byte{syncWant, 1, 0x7f}},
		{"want empty name", []byte{syncWant, 1, 0}},
		{"want of a million names", []byte{syncWant, 0xc0, 0x84, 0x3d}},
	}
	for _, tt := range bad {
		if _, err := decodeTopologySync(tt.msg); err == nil {
			t.Errorf("%s: %x decoded", tt.name, tt.msg)
		}
	}
	// Random bytes and random cuts of good messages never panic.
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	for i := 0; i < 20000; i++ {
		var b []byte
		if i%2 == 0 {
			good := msgs[rng.Intn(len(msgs))].encode()
			b = append([]byte(nil), good[:rng.Intn(len(good)+1)]...)
			if len(b) > 0 {
				b[rng.Intn(len(b))] ^= byte(rng.Intn(256))
			}
		} else {
			b = make([]byte, rng.Intn(40))
			rng.Read(b)
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("seed %d: %x: panic %v", seed, b, p)
				}
			}()
			decodeTopologySync(b)
		}()
	}
}

// TestTopologyCost: at 200 peers with 12 connections each, the periodic
// message is the same few dozen bytes as at 50 (upstream sends the whole
// topology, which grows with the peers), one change costs about its two
// entries at either size, and the repair of a missed change costs a few
// kilobytes and leaves the two routers' digests equal (checked inside).
func TestTopologyCost(t *testing.T) {
	small, err := MeasureTopologyCost(50, 12)
	if err != nil {
		t.Fatal(err)
	}
	large, err := MeasureTopologyCost(200, 12)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("50 peers: %+v", small)
	t.Logf("200 peers: %+v", large)
	// The digest carries the peer count as a uvarint: one byte more from
	// 128 peers.
	if large.Digest > small.Digest+1 || large.Digest > 64 {
		t.Errorf("periodic digest %d B at 50 peers, %d B at 200", small.Digest, large.Digest)
	}
	if large.Full < 3*small.Full || large.Full < 200*large.Degree*10 {
		t.Errorf("whole topology %d B at 50 peers, %d B at 200: not what upstream sends", small.Full, large.Full)
	}
	if large.Change > 2*small.Change || large.Change*20 > large.Full {
		t.Errorf("one change %d B at 50 peers, %d B at 200 (whole topology %d B)", small.Change, large.Change, large.Full)
	}
	if large.Repair*10 > large.Full || large.RepairMessages > 6 {
		t.Errorf("repair %d B in %d messages (whole topology %d B)", large.Repair, large.RepairMessages, large.Full)
	}
	if _, err := MeasureTopologyCost(10, 3); err == nil {
		t.Error("odd degree accepted")
	}
}

// syncConnection is a test connection whose remote takes digests, and
// which loses what it sends while drop is set.
type syncConnection struct {
	*mockGossipConnection
	drop *int32
}

func (syncConnection) topologySync() bool { return true }

func (c syncConnection) SendProtocolMsg(pm protocolMsg) error {
	if atomic.LoadInt32(c.drop) != 0 {
		return nil
	}
	return c.mockGossipConnection.SendProtocolMsg(pm)
}

// addTestSyncConnection connects r1 and r2 both ways and returns the drop
// switches of r1->r2 and r2->r1.
func addTestSyncConnection(t *testing.T, r1, r2 *Router) (drop12, drop21 *int32) {
	t.Helper()
	mk := func(from, to *Router) *int32 {
		toPeer := from.Peers.fetchWithDefault(newPeer(to.Ourself.Name, to.Ourself.NickName, to.Ourself.UID, 0, to.Ourself.ShortID))
		mock := &mockGossipConnection{
			remoteConnection: *newRemoteConnection(from.Ourself.Peer, toPeer, "", false, true),
			dest:             to,
			start:            make(chan struct{}),
		}
		conn := syncConnection{mock, new(int32)}
		mock.senders = newGossipSenders(conn, make(chan struct{}))
		if err := from.Ourself.handleAddConnection(conn, false); err != nil {
			t.Fatal(err)
		}
		from.Ourself.handleConnectionEstablished(conn)
		mock.Start()
		return conn.drop
	}
	return mk(r1, r2), mk(r2, r1)
}

func digestsEqual(routers ...*Router) bool {
	for _, r := range routers[1:] {
		if !bytes.Equal(r.Peers.digestMsg(), routers[0].Peers.digestMsg()) {
			return false
		}
	}
	return true
}

func digestWire(r *Router) uint64 {
	return uint64(1 + len(gobEncode(topologySyncChannel, r.Ourself.Name, r.Peers.digestMsg())))
}

// TestTopologySyncRepairsLostUpdate: in a line r1-r2-r3, r3 connects to a
// new peer r4, and the news that r2 relays to r1 is lost. An idle round
// between peers that agree sends the digests and nothing else; a periodic
// round of either r1 or r2 brings r1 up to date (the exchange runs the other
// way round in each).
func TestTopologySyncRepairsLostUpdate(t *testing.T) {
	for _, repairer := range []int{1, 0} {
		r1 := newTestRouter(t, "01:00:00:01:00:00")
		r2 := newTestRouter(t, "02:00:00:02:00:00")
		r3 := newTestRouter(t, "03:00:00:03:00:00")
		r4 := newTestRouter(t, "04:00:00:04:00:00")
		routers := []*Router{r1, r2, r3, r4}
		var counters []*deliveryCounter
		for _, r := range routers {
			counters = append(counters, countDeliveries(r))
		}
		_, drop21 := addTestSyncConnection(t, r1, r2)
		addTestSyncConnection(t, r2, r3)
		flushAndCheckTopology(t, routers[:3], r1.tp(r2), r2.tp(r1, r3), r3.tp(r2))

		atomic.StoreInt32(drop21, 1)
		addTestSyncConnection(t, r3, r4)
		sendPendingTopologyUpdates(routers...)
		sendPendingGossip(routers...)
		atomic.StoreInt32(drop21, 0)
		if r1.Peers.Fetch(r4.Ourself.Name) != nil || digestsEqual(routers...) {
			t.Fatal("nothing was lost: the test would not test the repair")
		}
		if !digestsEqual(r2, r3, r4) {
			t.Fatal("r2, r3 and r4 disagree")
		}

		// An idle round on r3 and r4, which agree with their
		// neighbours: r3's digest to r2 and r4, r4's to r3, and no
		// exchange.
		var before []map[delivery]int
		for _, c := range counters {
			before = append(before, c.snapshot())
		}
		r3.sendAllGossip()
		r4.sendAllGossip()
		sendPendingGossip(routers...)
		digestFrom := func(r *Router) map[delivery]int { return map[delivery]int{{r.Ourself.Name, "digest"}: 1} }
		for i, want := range []map[delivery]int{{}, digestFrom(r3), digestFrom(r4), digestFrom(r3)} {
			if got := counters[i].since(before[i]); !maps.Equal(got, want) {
				t.Errorf("an idle round: %s was delivered %v, want %v", routers[i].Ourself.Name, got, want)
			}
		}

		routers[repairer].sendAllGossip()
		sendPendingGossip(routers...)
		if !digestsEqual(routers...) {
			t.Fatalf("r1 was not repaired by %s's round", routers[repairer].Ourself.Name)
		}
		flushAndCheckTopology(t, routers, r1.tp(r2), r2.tp(r1, r3), r3.tp(r2, r4), r4.tp(r3))
	}
}
