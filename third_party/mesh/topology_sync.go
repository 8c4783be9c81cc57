package mesh

// Topology anti-entropy by digest (carve's patch; see PATCHED.md).
//
// Upstream mesh gossips the whole topology (every peer with its connection
// list) to a few neighbours every gossip interval. At thousands of peers that
// is megabytes per message, per connection, per round, although changes
// already travel as deltas (broadcastTopologyUpdate and OnGossip carry only
// the peers that changed). Here, on connections whose remote advertised the
// topologySyncFeature in its handshake, the periodic round sends a digest
// instead, and only a mismatch costs more:
//
//	A -> B  digest: peer count and a hash of every (name, uid, version)
//	B -> A  buckets: when the digests differ, a hash per bucket of peer names
//	A -> B  summary: for the buckets that differ, A's (name, uid, version)s
//	B -> A  the entries B has newer or A lacks (as ordinary topology gossip)
//	B -> A  want: the names A has newer or B lacks
//	A -> B  those entries (as ordinary topology gossip)
//
// The entries go on the "topology" channel, so the receiver applies them as
// any topology update and relays what was news to it. The digest messages go
// on their own channel, to the neighbour only, and are never relayed. A
// connection to a peer without the feature (upstream mesh) still gets the
// whole topology every round, so mixed versions keep converging.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sort"
)

const (
	// topologySyncFeature is the handshake feature by which a peer says it
	// understands the topologySyncChannel. Peers without it ignore it.
	topologySyncFeature = "TopologySync"
	// topologySyncChannel carries the digest exchange.
	topologySyncChannel = "topology-sync"

	// syncBucketTarget is about how many peers a bucket holds; maxSyncBuckets
	// bounds the bucket message (8 bytes a bucket).
	syncBucketTarget = 16
	maxSyncBuckets   = 256
	// maxSyncNames bounds the entries one summary or want message may carry
	// (more than any mesh can hold: short ids are 12 bits).
	maxSyncNames = 1 << 16
	maxNameBytes = 64

	// The digest is the peer count (uvarint) and an 8-byte hash; bucket
	// hashes are 8 bytes each.
	syncDigest  byte = 1
	syncBuckets byte = 2
	syncSummary byte = 3
	syncWant    byte = 4
)

// peerVersion is what decides whether one topology entry supersedes another.
type peerVersion struct {
	name       PeerName
	uid        PeerUID
	version    uint64
	hasShortID bool
}

// newerThan mirrors the rule by which applyDecodedUpdate accepts an entry
// over the one it holds, so that what the exchange calls newer is what the
// receiver will take.
func (pv peerVersion) newerThan(o peerVersion) bool {
	if pv.version != o.version {
		return pv.version > o.version
	}
	if pv.uid != o.uid {
		return pv.uid > o.uid
	}
	return pv.hasShortID && !o.hasShortID
}

func (pv peerVersion) hash() uint64 {
	h := fnv.New64a()
	h.Write(pv.name.bytes())
	var b [17]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(pv.uid))
	binary.LittleEndian.PutUint64(b[8:], pv.version)
	if pv.hasShortID {
		b[16] = 1
	}
	h.Write(b[:])
	return mix64(h.Sum64())
}

// mix64 spreads fnv's bits (splitmix64's finaliser), so that XORs of entry
// hashes do not cancel on similar entries.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func bucketOf(name PeerName, n int) int {
	h := fnv.New64a()
	h.Write(name.bytes())
	return int(mix64(h.Sum64()) & uint64(n-1))
}

// syncBucketCount is the number of buckets for a topology of count peers: a
// power of two, about syncBucketTarget peers a bucket, at most maxSyncBuckets.
func syncBucketCount(count int) int {
	n := 1
	for n*syncBucketTarget < count && n < maxSyncBuckets {
		n *= 2
	}
	return n
}

// versions returns the version of every peer reachable from us, the peers
// a garbage collection would keep. Unreachable peers (a peer that left, which
// some still hold until their next collection) are left out of the digest
// and never sent in an exchange: otherwise a peer that has not collected yet
// would hand it back to one that has, again and again. Lock order as in
// garbageCollect: Peers, then the local peer.
func (peers *Peers) versions() []peerVersion {
	peers.RLock()
	defer peers.RUnlock()
	peers.ourself.RLock()
	defer peers.ourself.RUnlock()
	_, reached := peers.ourself.routes(nil, false)
	out := make([]peerVersion, 0, len(reached))
	for name := range reached {
		if p, found := peers.byName[name]; found {
			out = append(out, peerVersion{name: p.Name, uid: p.UID, version: p.Version, hasShortID: p.HasShortID})
		}
	}
	return out
}

func topologyDigest(vs []peerVersion) uint64 {
	var d uint64
	for _, v := range vs {
		d ^= v.hash()
	}
	return d
}

func bucketHashes(vs []peerVersion, n int) []uint64 {
	hs := make([]uint64, n)
	for _, v := range vs {
		hs[bucketOf(v.name, n)] ^= v.hash()
	}
	return hs
}

// topologySyncMsg is one message of the exchange. Only the fields of its
// kind are set.
type topologySyncMsg struct {
	kind    byte
	count   int           // digest
	digest  uint64        // digest
	n       int           // buckets, summary: number of buckets
	hashes  []uint64      // buckets
	buckets []int         // summary: the buckets that differ
	entries []peerVersion // summary
	names   []PeerName    // want
}

func putUvarint(buf *bytes.Buffer, x uint64) {
	var b [binary.MaxVarintLen64]byte
	buf.Write(b[:binary.PutUvarint(b[:], x)])
}

func putUint64(buf *bytes.Buffer, x uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], x)
	buf.Write(b[:])
}

func putName(buf *bytes.Buffer, name PeerName) {
	b := name.bytes()
	putUvarint(buf, uint64(len(b)))
	buf.Write(b)
}

func (m topologySyncMsg) encode() []byte {
	buf := new(bytes.Buffer)
	buf.WriteByte(m.kind)
	switch m.kind {
	case syncDigest:
		putUvarint(buf, uint64(m.count))
		putUint64(buf, m.digest)
	case syncBuckets:
		putUvarint(buf, uint64(m.n))
		for _, h := range m.hashes {
			putUint64(buf, h)
		}
	case syncSummary:
		putUvarint(buf, uint64(m.n))
		putUvarint(buf, uint64(len(m.buckets)))
		for _, b := range m.buckets {
			putUvarint(buf, uint64(b))
		}
		putUvarint(buf, uint64(len(m.entries)))
		for _, e := range m.entries {
			putName(buf, e.name)
			putUvarint(buf, uint64(e.uid))
			putUvarint(buf, e.version)
			if e.hasShortID {
				buf.WriteByte(1)
			} else {
				buf.WriteByte(0)
			}
		}
	case syncWant:
		putUvarint(buf, uint64(len(m.names)))
		for _, name := range m.names {
			putName(buf, name)
		}
	}
	return buf.Bytes()
}

var errBadTopologySync = errors.New("malformed topology sync message")

// syncReader decodes strictly: every length is bounded before anything is
// allocated, and a short or trailing message is an error, never a panic.
type syncReader struct {
	r   *bytes.Reader
	err error
}

func (s *syncReader) uvarint() uint64 {
	if s.err != nil {
		return 0
	}
	x, err := binary.ReadUvarint(s.r)
	if err != nil {
		s.err = errBadTopologySync
	}
	return x
}

// bounded reads a uvarint no greater than max.
func (s *syncReader) bounded(max int) int {
	x := s.uvarint()
	if s.err == nil && x > uint64(max) {
		s.err = fmt.Errorf("%w: %d exceeds %d", errBadTopologySync, x, max)
		return 0
	}
	return int(x)
}

func (s *syncReader) uint64() uint64 {
	var b [8]byte
	if s.err == nil {
		if _, err := io.ReadFull(s.r, b[:]); err != nil {
			s.err = errBadTopologySync
		}
	}
	return binary.BigEndian.Uint64(b[:])
}

func (s *syncReader) byte() byte {
	if s.err != nil {
		return 0
	}
	b, err := s.r.ReadByte()
	if err != nil {
		s.err = errBadTopologySync
	}
	return b
}

func (s *syncReader) name() PeerName {
	n := s.bounded(maxNameBytes)
	if s.err != nil || n == 0 || n > s.r.Len() {
		if s.err == nil {
			s.err = errBadTopologySync
		}
		return UnknownPeerName
	}
	b := make([]byte, n)
	s.r.Read(b)
	return PeerNameFromBin(b)
}

// powerOfTwoBuckets reads a bucket count: a power of two up to maxSyncBuckets.
func (s *syncReader) bucketCount() int {
	n := s.bounded(maxSyncBuckets)
	if s.err == nil && (n == 0 || n&(n-1) != 0) {
		s.err = fmt.Errorf("%w: %d buckets", errBadTopologySync, n)
	}
	return n
}

func decodeTopologySync(msg []byte) (topologySyncMsg, error) {
	s := &syncReader{r: bytes.NewReader(msg)}
	m := topologySyncMsg{kind: s.byte()}
	switch m.kind {
	case syncDigest:
		m.count = s.bounded(maxSyncNames)
		m.digest = s.uint64()
	case syncBuckets:
		m.n = s.bucketCount()
		for i := 0; s.err == nil && i < m.n; i++ {
			m.hashes = append(m.hashes, s.uint64())
		}
	case syncSummary:
		m.n = s.bucketCount()
		k := s.bounded(m.n)
		for i := 0; s.err == nil && i < k; i++ {
			m.buckets = append(m.buckets, s.bounded(m.n-1))
		}
		count := s.bounded(maxSyncNames)
		for i := 0; s.err == nil && i < count; i++ {
			e := peerVersion{name: s.name(), uid: PeerUID(s.uvarint()), version: s.uvarint()}
			switch s.byte() {
			case 0:
			case 1:
				e.hasShortID = true
			default:
				if s.err == nil {
					s.err = errBadTopologySync
				}
			}
			m.entries = append(m.entries, e)
		}
	case syncWant:
		count := s.bounded(maxSyncNames)
		for i := 0; s.err == nil && i < count; i++ {
			m.names = append(m.names, s.name())
		}
	default:
		if s.err == nil {
			s.err = fmt.Errorf("%w: kind %d", errBadTopologySync, m.kind)
		}
	}
	if s.err == nil && s.r.Len() != 0 {
		s.err = fmt.Errorf("%w: %d trailing bytes", errBadTopologySync, s.r.Len())
	}
	return m, s.err
}

// digestMsg is the periodic message: constant size whatever the topology.
func (peers *Peers) digestMsg() []byte {
	vs := peers.versions()
	return topologySyncMsg{kind: syncDigest, count: len(vs), digest: topologyDigest(vs)}.encode()
}

// handleTopologySync answers one message of the exchange from a neighbour:
// reply goes back to it on the sync channel, and send are the names whose
// topology entries go to it on the topology channel. Both may be empty.
func (peers *Peers) handleTopologySync(msg []byte) (reply []byte, send peerNameSet, err error) {
	m, err := decodeTopologySync(msg)
	if err != nil {
		return nil, nil, err
	}
	vs := peers.versions()
	switch m.kind {
	case syncDigest:
		if m.count == len(vs) && m.digest == topologyDigest(vs) {
			return nil, nil, nil
		}
		count := len(vs)
		if m.count > count {
			count = m.count
		}
		n := syncBucketCount(count)
		return topologySyncMsg{kind: syncBuckets, n: n, hashes: bucketHashes(vs, n)}.encode(), nil, nil
	case syncBuckets:
		ours := bucketHashes(vs, m.n)
		differ := make(map[int]bool)
		out := topologySyncMsg{kind: syncSummary, n: m.n}
		for b, h := range ours {
			if h != m.hashes[b] {
				differ[b] = true
				out.buckets = append(out.buckets, b)
			}
		}
		if len(out.buckets) == 0 {
			return nil, nil, nil
		}
		for _, v := range vs {
			if differ[bucketOf(v.name, m.n)] {
				out.entries = append(out.entries, v)
			}
		}
		return out.encode(), nil, nil
	case syncSummary:
		inBuckets := make(map[int]bool, len(m.buckets))
		for _, b := range m.buckets {
			inBuckets[b] = true
		}
		theirs := make(map[PeerName]peerVersion, len(m.entries))
		for _, e := range m.entries {
			// An entry outside the buckets listed would be judged
			// against nothing of ours; ignore it.
			if inBuckets[bucketOf(e.name, m.n)] {
				theirs[e.name] = e
			}
		}
		send = make(peerNameSet)
		for _, v := range vs {
			if !inBuckets[bucketOf(v.name, m.n)] {
				continue
			}
			t, found := theirs[v.name]
			delete(theirs, v.name)
			if !found || v.newerThan(t) {
				send[v.name] = struct{}{}
			} else if t.newerThan(v) {
				theirs[v.name] = t // wanted
			}
		}
		// What is left in theirs is what we lack or have older.
		if len(theirs) > 0 {
			want := topologySyncMsg{kind: syncWant}
			for name := range theirs {
				want.names = append(want.names, name)
			}
			sort.Slice(want.names, func(i, j int) bool { return want.names[i] < want.names[j] })
			reply = want.encode()
		}
		return reply, send, nil
	case syncWant:
		reachable := make(map[PeerName]bool, len(vs))
		for _, v := range vs {
			reachable[v.name] = true
		}
		send = make(peerNameSet)
		for _, name := range m.names {
			if reachable[name] {
				send[name] = struct{}{}
			}
		}
		return nil, send, nil
	}
	return nil, nil, nil
}

// topologySyncData is what the sync channel queues for one connection: the
// messages in order. A digest queued while an earlier one waits replaces it.
type topologySyncData struct {
	msgs [][]byte
}

// Encode implements GossipData.
func (d *topologySyncData) Encode() [][]byte { return d.msgs }

// Merge implements GossipData.
func (d *topologySyncData) Merge(other GossipData) GossipData {
	o, ok := other.(*topologySyncData)
	if !ok {
		return d
	}
	msgs := make([][]byte, 0, len(d.msgs)+len(o.msgs))
	for _, m := range d.msgs {
		if len(m) > 0 && m[0] == syncDigest && len(o.msgs) > 0 && len(o.msgs[0]) > 0 && o.msgs[0][0] == syncDigest {
			continue
		}
		msgs = append(msgs, m)
	}
	msgs = append(msgs, o.msgs...)
	return &topologySyncData{msgs: msgs}
}

// topologySyncGossiper receives the sync channel. It has nothing to gossip
// by itself (the router's periodic round sends the digests) and relays
// nothing: every message is for the neighbour that sent it.
type topologySyncGossiper struct {
	router *Router
}

// Gossip implements Gossiper.
func (*topologySyncGossiper) Gossip() GossipData { return nil }

// OnGossipUnicast implements Gossiper.
func (*topologySyncGossiper) OnGossipUnicast(PeerName, []byte) error { return nil }

// OnGossipBroadcast implements Gossiper.
func (*topologySyncGossiper) OnGossipBroadcast(PeerName, []byte) (GossipData, error) {
	return nil, nil
}

// OnGossip implements Gossiper; messages arrive through onGossipFrom.
func (*topologySyncGossiper) OnGossip([]byte) (GossipData, error) { return nil, nil }

// onGossipFrom answers a message from neighbour src down the connection to
// it. A malformed message is logged and dropped rather than returned: an
// error would close the connection.
func (g *topologySyncGossiper) onGossipFrom(src PeerName, msg []byte) (GossipData, error) {
	reply, send, err := g.router.Peers.handleTopologySync(msg)
	if err != nil {
		g.router.logger.Printf("[gossip %s]: from %s: %v", topologySyncChannel, src, err)
		return nil, nil
	}
	conn, found := g.router.Ourself.ConnectionTo(src)
	if !found {
		return nil, nil
	}
	if len(send) > 0 {
		g.router.topologyChannel.SendDown(conn, &topologyGossipData{peers: g.router.Peers, update: send})
	}
	if reply != nil {
		g.router.syncChannel.SendDown(conn, &topologySyncData{msgs: [][]byte{reply}})
	}
	return nil, nil
}

// syncsTopology says whether the remote end of conn takes digests.
func syncsTopology(conn Connection) bool {
	c, ok := conn.(interface{ topologySync() bool })
	return ok && c.topologySync()
}

// sendTopologyRound is the periodic topology gossip: to the same random
// neighbours as upstream, a digest where the neighbour takes one, and the
// whole topology (as upstream) where it does not.
func (router *Router) sendTopologyRound() {
	c := router.topologyChannel
	c.routes.ensureRecalculated()
	var full, digest GossipData
	for _, conn := range router.Ourself.ConnectionsTo(c.routes.randomNeighbours(router.Ourself.Name)) {
		if syncsTopology(conn) {
			if digest == nil {
				digest = &topologySyncData{msgs: [][]byte{router.Peers.digestMsg()}}
			}
			router.syncChannel.SendDown(conn, digest)
			continue
		}
		if full == nil {
			full = router.Gossip()
		}
		c.SendDown(conn, full)
	}
}
