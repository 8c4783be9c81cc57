package mesh

// Real routers over TCP on 127.0.0.1, with peer discovery off and a few
// connections each, as carve runs them: peers that are not connected learn of
// each other only through topology gossip. mesh has data races the race
// detector reports; run these without -race.

import (
	"bytes"
	"fmt"
	"io/ioutil"
	"log"
	"maps"
	"net"
	"sort"
	"sync"
	"testing"
	"time"
)

type tcpNode struct {
	r    *Router
	addr string
}

func nodeName(i int) PeerName { return PeerNameFromBin([]byte{0x02, 0, 0, 0, 0, byte(i)}) }

// startNode starts router i on a free loopback port. upstream makes it
// behave as upstream mesh (no digests either way).
func startNode(t *testing.T, i int, interval time.Duration, upstream bool) tcpNode {
	t.Helper()
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		iv := interval
		r, err := NewRouter(Config{Host: "127.0.0.1", Port: port, ConnLimit: 16, GossipInterval: &iv,
			ProtocolMinVersion: ProtocolMaxVersion, TrustedSubnets: []*net.IPNet{}},
			nodeName(i), fmt.Sprintf("node-%d", i), nil, log.New(ioutil.Discard, "", 0))
		if err != nil {
			t.Fatal(err)
		}
		r.noTopologySync = upstream
		if err := startRouter(r); err != nil {
			if attempt < 5 {
				continue // the port was taken meanwhile
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { stopNode(r) })
		return tcpNode{r: r, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	}
}

func startRouter(r *Router) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("listen: %v", p)
		}
	}()
	r.Start()
	return nil
}

func stopNode(r *Router) {
	r.ConnectionMaker.ForgetConnections(r.ConnectionMaker.Targets(false))
	r.Stop()
}

func (n tcpNode) connect(t *testing.T, to tcpNode) {
	t.Helper()
	if errs := n.r.ConnectionMaker.InitiateConnections([]string{to.addr}, false); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// cut closes n's connection to peer, which n had dialled, and stops n
// dialling it again.
func (n tcpNode) cut(to tcpNode) {
	n.r.ConnectionMaker.ForgetConnections([]string{to.addr})
	if conn, ok := n.r.Ourself.ConnectionTo(to.r.Ourself.Name); ok {
		conn.(ourConnection).shutdown(fmt.Errorf("cut by the test"))
	}
}

// eventually polls cond until it returns nil, for at most a minute.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agree checks that every node knows exactly the nodes given, each at its
// current incarnation, and that all their topologies are the same.
func agree(nodes []tcpNode) error {
	var want []string
	for _, n := range nodes {
		want = append(want, n.r.Ourself.Name.String())
	}
	sort.Strings(want)
	for _, n := range nodes {
		var got []string
		for _, d := range n.r.Peers.Descriptions() {
			got = append(got, d.Name.String())
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("%s knows %v, want %v", n.r.Ourself.Name, got, want)
		}
		for _, m := range nodes {
			if p := n.r.Peers.Fetch(m.r.Ourself.Name); p == nil || p.UID != m.r.Ourself.UID {
				return fmt.Errorf("%s holds an old incarnation of %s", n.r.Ourself.Name, m.r.Ourself.Name)
			}
		}
		if !bytes.Equal(n.r.Peers.digestMsg(), nodes[0].r.Peers.digestMsg()) {
			return fmt.Errorf("%s and %s know different topologies", n.r.Ourself.Name, nodes[0].r.Ourself.Name)
		}
	}
	return nil
}

// startLine starts n nodes, node i dialling node i-1.
func startLine(t *testing.T, n int, interval time.Duration, upstream map[int]bool) []tcpNode {
	t.Helper()
	var nodes []tcpNode
	for i := 0; i < n; i++ {
		nodes = append(nodes, startNode(t, i, interval, upstream[i]))
		if i > 0 {
			nodes[i].connect(t, nodes[i-1])
		}
	}
	return nodes
}

func TestTopologyTCPLineThenRing(t *testing.T) {
	nodes := startLine(t, 10, 100*time.Millisecond, nil)
	eventually(t, "a line of 10 converges", func() error { return agree(nodes) })
	nodes[9].connect(t, nodes[0])
	eventually(t, "the ring converges", func() error {
		for _, n := range nodes {
			if c := n.r.Ourself.connectionCount(); c != 2 {
				return fmt.Errorf("%s has %d connections", n.r.Ourself.Name, c)
			}
		}
		return agree(nodes)
	})
}

func TestTopologyTCPRestart(t *testing.T) {
	nodes := startLine(t, 8, 100*time.Millisecond, nil)
	nodes[7].connect(t, nodes[0])
	eventually(t, "the ring converges", func() error { return agree(nodes) })
	// Node 3 restarts: a new incarnation (another uid) at another address.
	old := nodes[3]
	nodes[4].cut(old)
	stopNode(old.r)
	nodes[3] = startNode(t, 3, 100*time.Millisecond, false)
	if nodes[3].r.Ourself.UID == old.r.Ourself.UID {
		t.Fatal("the restarted router has the old uid")
	}
	nodes[3].connect(t, nodes[2])
	nodes[4].connect(t, nodes[3])
	eventually(t, "the ring reconverges on the new incarnation", func() error { return agree(nodes) })
}

func TestTopologyTCPPartitionHeals(t *testing.T) {
	nodes := startLine(t, 8, 100*time.Millisecond, nil)
	eventually(t, "the line converges", func() error { return agree(nodes) })
	nodes[4].cut(nodes[3])
	eventually(t, "each half forgets the other", func() error {
		if err := agree(nodes[:4]); err != nil {
			return err
		}
		return agree(nodes[4:])
	})
	nodes[4].connect(t, nodes[3])
	eventually(t, "the healed line converges", func() error { return agree(nodes) })
}

func TestTopologyTCPForgetsRemoved(t *testing.T) {
	nodes := startLine(t, 8, 100*time.Millisecond, nil)
	nodes[7].connect(t, nodes[0])
	eventually(t, "the ring converges", func() error { return agree(nodes) })
	nodes[6].cut(nodes[5])
	stopNode(nodes[5].r)
	rest := append(append([]tcpNode(nil), nodes[:5]...), nodes[6:]...)
	eventually(t, "the others forget the removed node", func() error {
		err := agree(rest)
		if err != nil {
			n0 := rest[0].r
			n0.Peers.RLock()
			for _, p := range n0.Peers.byName {
				for name := range p.connections {
					if name == nodes[5].r.Ourself.Name {
						err = fmt.Errorf("%v; %s's entry (v%d) lists it, refs %d", err, p.Name, p.Version, n0.Peers.byName[name].localRefCount)
					}
				}
			}
			n0.Peers.RUnlock()
		}
		return err
	})
}

// TestTopologyTCPMixedVersions: two routers that behave as upstream mesh
// (no digests) in a ring of new ones: all converge, through restarts too;
// the upstream ones never send a digest, the new ones do.
func TestTopologyTCPMixedVersions(t *testing.T) {
	upstream := map[int]bool{2: true, 5: true}
	nodes := startLine(t, 8, 100*time.Millisecond, upstream)
	nodes[7].connect(t, nodes[0])
	eventually(t, "the mixed ring converges", func() error { return agree(nodes) })
	old := nodes[5]
	nodes[6].cut(old)
	stopNode(old.r)
	nodes[5] = startNode(t, 5, 100*time.Millisecond, true)
	nodes[5].connect(t, nodes[4])
	nodes[6].connect(t, nodes[5])
	eventually(t, "the mixed ring reconverges after a restart", func() error { return agree(nodes) })
	for i, n := range nodes {
		if sent := n.r.syncChannel.sentBytes(); upstream[i] != (sent == 0) {
			t.Errorf("node %d (upstream %v) sent %d B of digests", i, upstream[i], sent)
		}
	}
}

// TestTopologyTCPIdleRound: 12 routers with 4 connections each, periodic
// rounds driven by the test. Once they agree, a round costs each router one
// digest per neighbour and nothing more (no bucket, summary or want, no
// topology gossip); upstream it cost the whole topology per neighbour.
//
// It counts the messages each router delivers, by sender and kind, between
// quiescent points (settle), not bytes: the routers converging leave digests
// and exchanges queued and in flight for a while on a loaded machine, which
// a byte count taken right after convergence charged to the first idle round
// ("3066 B sent, want 2016").
func TestTopologyTCPIdleRound(t *testing.T) {
	const n = 12
	var nodes []tcpNode
	var counters []*deliveryCounter
	for i := 0; i < n; i++ {
		nodes = append(nodes, startNode(t, i, time.Hour, false))
		counters = append(counters, countDeliveries(nodes[i].r))
	}
	for i := range nodes {
		nodes[i].connect(t, nodes[(i+n-1)%n])
		nodes[i].connect(t, nodes[(i+n-2)%n])
	}
	eventually(t, "the routers converge", func() error {
		for _, nd := range nodes {
			nd.r.sendAllGossip()
		}
		return agree(nodes)
	})
	eventually(t, "no topology update is pending", func() error {
		for _, nd := range nodes {
			nd.r.Ourself.RLock()
			pending := nd.r.Ourself.pendingTopologyUpdate
			nd.r.Ourself.RUnlock()
			if pending || nd.r.Ourself.connectionCount() != 4 {
				return fmt.Errorf("%s: pending %v, %d connections", nd.r.Ourself.Name, pending, nd.r.Ourself.connectionCount())
			}
		}
		return agree(nodes)
	})
	settle(t, nodes, counters)
	var digests, full uint64
	for _, nd := range nodes {
		digests += 4 * digestWire(nd.r)
		full += 4 * uint64(1+len(gobEncode("topology", nd.r.Ourself.Name, nd.r.Peers.encodePeers(nd.r.Peers.names()))))
	}
	for round := 1; round <= 3; round++ {
		before := make([]map[delivery]int, n)
		for i, c := range counters {
			before[i] = c.snapshot()
		}
		for _, nd := range nodes {
			nd.r.sendAllGossip()
		}
		settle(t, nodes, counters)
		for i, c := range counters {
			want := map[delivery]int{}
			for conn := range nodes[i].r.Ourself.getConnections() {
				want[delivery{conn.Remote().Name, "digest"}] = 1
			}
			if got := c.since(before[i]); !maps.Equal(got, want) {
				t.Errorf("round %d: %s was delivered %v, want %v", round, nodes[i].r.Ourself.Name, got, want)
			}
		}
		if err := agree(nodes); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	t.Logf("an idle round of %d routers: %d B of digests; the whole topology to every neighbour would be %d B", n, digests, full)
}

// delivery is what deliveryCounter counts: messages of a kind from a sender
// (the origin, for a broadcast).
type delivery struct {
	from PeerName
	kind string
}

func (d delivery) String() string { return d.kind + " from " + d.from.String() }

// deliveryCounter wraps the gossipers of a router's topology and
// topology-sync channels: it counts the messages they are delivered, by
// sender and kind, and their size as the sending channel counted it when it
// made them (gossipChannel.sentBytes), so that settle can tell when
// everything made has been delivered. A message is counted once its
// handler has returned, with any answer it queued.
type deliveryCounter struct {
	mu        sync.Mutex
	delivered uint64
	msgs      map[delivery]int
}

// countDeliveries installs a deliveryCounter on r, before it has any
// connection.
func countDeliveries(r *Router) *deliveryCounter {
	c := &deliveryCounter{msgs: make(map[delivery]int)}
	r.topologyChannel.gossiper = &countingGossiper{Gossiper: r.topologyChannel.gossiper, channel: r.topologyChannel.name, c: c}
	r.syncChannel.gossiper = &countingGossiper{Gossiper: r.syncChannel.gossiper, channel: r.syncChannel.name, c: c}
	return c
}

func (c *deliveryCounter) count(channel string, src PeerName, msg []byte, kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delivered += uint64(1 + len(gobEncode(channel, src, msg)))
	c.msgs[delivery{src, kind}]++
}

func (c *deliveryCounter) snapshot() map[delivery]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[delivery]int, len(c.msgs))
	for d, n := range c.msgs {
		m[d] = n
	}
	return m
}

// since is what c was delivered after before (a snapshot): the counts
// that grew, by how much.
func (c *deliveryCounter) since(before map[delivery]int) map[delivery]int {
	got := map[delivery]int{}
	for d, n := range c.snapshot() {
		if n > before[d] {
			got[d] = n - before[d]
		}
	}
	return got
}

func (c *deliveryCounter) deliveredBytes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.delivered
}

// countingGossiper is one channel's gossiper with its deliveries counted.
type countingGossiper struct {
	Gossiper
	channel string
	c       *deliveryCounter
}

// syncKind names the kind of a sync message.
func syncKind(msg []byte) string {
	if len(msg) > 0 {
		switch msg[0] {
		case syncDigest:
			return "digest"
		case syncBuckets:
			return "buckets"
		case syncSummary:
			return "summary"
		case syncWant:
			return "want"
		}
	}
	return "sync message of unknown kind"
}

// onGossipFrom is how gossipChannel.deliver hands over a gossip message
// when the gossiper takes its sender.
func (g *countingGossiper) onGossipFrom(src PeerName, msg []byte) (GossipData, error) {
	var update GossipData
	var err error
	kind := g.channel
	if from, ok := g.Gossiper.(gossipFromReceiver); ok {
		update, err = from.onGossipFrom(src, msg)
		kind = syncKind(msg)
	} else {
		update, err = g.Gossiper.OnGossip(msg)
	}
	g.c.count(g.channel, src, msg, kind)
	return update, err
}

// OnGossipBroadcast implements Gossiper.
func (g *countingGossiper) OnGossipBroadcast(src PeerName, msg []byte) (GossipData, error) {
	update, err := g.Gossiper.OnGossipBroadcast(src, msg)
	g.c.count(g.channel, src, msg, g.channel+" broadcast")
	return update, err
}

// settle waits until the routers are quiescent: nothing queued in a gossip
// sender, nothing in flight, nothing being handled. Every sender is flushed
// (a flush returns once the sender has made what it held, or was making),
// and then nothing must have been made since the deliveries were read:
// everything made had been delivered, and its handler had returned, before
// the flush, which found nothing new to make.
func settle(t *testing.T, nodes []tcpNode, counters []*deliveryCounter) {
	t.Helper()
	eventually(t, "the routers are quiescent", func() error {
		var delivered, made uint64
		for _, c := range counters {
			delivered += c.deliveredBytes()
		}
		for _, nd := range nodes {
			nd.r.sendPendingGossip()
		}
		for _, nd := range nodes {
			made += nd.r.topologyChannel.sentBytes() + nd.r.syncChannel.sentBytes()
		}
		if made != delivered {
			return fmt.Errorf("%d B of gossip made, %d B delivered", made, delivered)
		}
		return nil
	})
}
