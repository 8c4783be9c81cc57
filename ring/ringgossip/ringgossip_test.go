package ringgossip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/gossip/fakegossip"
	"github.com/carve-net/carve/internal/testutil"
	"github.com/carve-net/carve/ring"
)

const universe = "10.128.0.0/16"

func newNetwork(t *testing.T, cfg fakegossip.Config) *fakegossip.Network {
	t.Helper()
	n := fakegossip.New(cfg)
	t.Cleanup(n.Close)
	return n
}

func newPeer(t *testing.T, r gossip.Router, seed uint64) *Peer {
	t.Helper()
	a, err := ring.NewAllocator(r.Self(), netip.MustParsePrefix(universe))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Router: r, Allocator: a, Seed: seed, RetryInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func joinPeers(t *testing.T, n *fakegossip.Network, count int) []*Peer {
	t.Helper()
	var peers []*Peer
	for i := range count {
		r, err := n.Join(fmt.Sprintf("agent-%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, newPeer(t, r, uint64(i+1)))
	}
	return peers
}

// lease is the master's lease of the i-th /24 (or of a smaller prefix).
func lease(id string, i int, bits int, index uint64) ring.Lease {
	return ring.Lease{Owner: id, Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, byte(i), 0}), bits), Version: index}
}

func encoded(p *Peer) []byte {
	var b []byte
	p.View(func(a *ring.Allocator) { b = a.EncodeRing() })
	return b
}

// bounded is a context for one blocking call of a test: it ends after
// testutil.WaitLimit, so that a call that never returns fails the test
// instead of running into -timeout (t.Context ends only after the test).
func bounded(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.WaitLimit)
	t.Cleanup(cancel)
	return ctx
}

// converge runs gossip rounds until every live peer holds the same ring;
// the bound is a number of rounds, not a time.
func converge(t *testing.T, n *fakegossip.Network, peers []*Peer) {
	t.Helper()
	for round := 0; ; round++ {
		if err := n.WaitIdle(bounded(t)); err != nil {
			t.Fatalf("seed %d: %v", n.Seed(), err)
		}
		same := true
		first := encoded(peers[0])
		for _, p := range peers[1:] {
			if !bytes.Equal(encoded(p), first) {
				same = false
				break
			}
		}
		if same {
			return
		}
		if round == 300 {
			t.Fatalf("seed %d: rings differ after %d gossip rounds", n.Seed(), round)
		}
		n.GossipRound()
	}
}

// checkDisjoint fails if two peers, each by its own ring, own one address.
func checkDisjoint(t *testing.T, seed uint64, peers []*Peer) {
	t.Helper()
	type span struct {
		peer string
		r    ring.Range
	}
	var spans []span
	for _, p := range peers {
		p.View(func(a *ring.Allocator) {
			for _, r := range a.Owned() {
				spans = append(spans, span{a.Self(), r})
			}
			if got, want := a.Owned(), a.Ring().RangesOf(a.Self()); !slices.Equal(got, want) {
				t.Fatalf("seed %d: %s space %v, ring %v", seed, a.Self(), got, want)
			}
		})
	}
	slices.SortFunc(spans, func(x, y span) int { return x.r.First.Compare(y.r.First) })
	for i := 1; i < len(spans); i++ {
		if spans[i].r.First.Compare(spans[i-1].r.Last) <= 0 {
			t.Fatalf("seed %d: %s owns %v and %s owns %v", seed, spans[i-1].peer, spans[i-1].r, spans[i].peer, spans[i].r)
		}
	}
}

// TestTwentyPeersConverge: 20 peers, each told only its own lease by the
// master, allocate, donate and request space while the network delays,
// drops, duplicates and reorders; a departed peer's ranges are taken over.
// Gossip brings them all to one ring, in which no address has two owners.
func TestTwentyPeersConverge(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d", seed)
			n := newNetwork(t, fakegossip.Config{
				Seed: seed, MaxDelay: 2 * time.Millisecond,
				DropRate: 0.2, DuplicateRate: 0.2, ReorderRate: 0.2,
			})
			peers := joinPeers(t, n, 20)
			rng := rand.New(rand.NewPCG(seed, 7))
			var leases []ring.Lease
			for i, p := range peers {
				l := lease(p.self, i+1, 24, uint64(i+1))
				leases = append(leases, l)
				if err := p.Update(func(a *ring.Allocator) error { _, err := a.Seed([]ring.Lease{l}, nil); return err }); err != nil {
					t.Fatal(err)
				}
			}
			for step := range 200 {
				p := peers[rng.IntN(len(peers))]
				switch rng.IntN(4) {
				case 0, 1:
					at := ring.Attachment{ContainerID: fmt.Sprint("c", step), Interface: "eth0"}
					_ = p.Update(func(a *ring.Allocator) error {
						for _, r := range a.Owned() {
							if _, err := a.Allocate(at, r.Prefixes()[0]); err == nil {
								return nil
							}
						}
						return nil
					})
				case 2:
					to := peers[rng.IntN(len(peers))].self
					if to != p.self {
						_ = p.Update(func(a *ring.Allocator) error { _, err := a.Donate(to); return err })
					}
				case 3:
					n.GossipRound()
				}
			}
			// One peer leaves for good. Once the others have converged
			// (so that they know every grant made to it) and merged its
			// last ring, one of them takes its ranges over.
			gone, heir := peers[19], peers[0]
			n.Leave(gone.self)
			last := encoded(gone)
			peers = peers[:19]
			converge(t, n, peers)
			if err := heir.Update(func(a *ring.Allocator) error {
				if _, err := a.MergeEncoded(last); err != nil {
					return err
				}
				_, err := a.Transfer(gone.self)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			converge(t, n, peers)
			checkDisjoint(t, seed, peers)
			var r *ring.Ring
			heir.View(func(a *ring.Allocator) { r = a.Ring() })
			if got := r.RangesOf(gone.self); len(got) != 0 {
				t.Fatalf("seed %d: departed peer still owns %v", seed, got)
			}
			for _, l := range leases[:19] {
				if o, _ := r.Owner(l.Prefix.Addr()); o == "" {
					t.Fatalf("seed %d: lease %v has no owner in the converged ring", seed, l)
				}
			}
		})
	}
}

// TestSpaceRequest: a peer whose range is full asks for space; the grant
// moves a block from a donor to it, and both agree on it at once (the
// requester from the answer, before any gossip).
func TestSpaceRequest(t *testing.T) {
	tests := []struct {
		name string
		cfg  fakegossip.Config
	}{
		{"clean", fakegossip.Config{Seed: 10}},
		{"lossy", fakegossip.Config{Seed: 11, MaxDelay: 3 * time.Millisecond, DropRate: 0.4, DuplicateRate: 0.3, ReorderRate: 0.3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Logf("seed %d", tt.cfg.Seed)
			n := newNetwork(t, tt.cfg)
			peers := joinPeers(t, n, 4)
			full := peers[0]
			leases := []ring.Lease{lease(full.self, 0, 30, 1)}
			for i, p := range peers[1:] {
				leases = append(leases, lease(p.self, i+1, 24, uint64(i+2)))
			}
			for _, p := range peers {
				if err := p.Update(func(a *ring.Allocator) error { _, err := a.Seed(leases, nil); return err }); err != nil {
					t.Fatal(err)
				}
			}
			// Fill the /30.
			if err := full.Update(func(a *ring.Allocator) error {
				for i, r := range a.Owned() {
					for x := r.First; ; x = x.Next() {
						if err := a.Claim(ring.Attachment{ContainerID: fmt.Sprint(i, x)}, x); err != nil {
							return err
						}
						if x == r.Last {
							break
						}
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			got, err := full.RequestSpace(bounded(t))
			if err != nil {
				t.Fatalf("seed %d: RequestSpace: %v", tt.cfg.Seed, err)
			}
			if got.Bits() != 25 {
				t.Errorf("granted %v, want the upper /25 of a donor's empty /24", got)
			}
			var donor string
			full.View(func(a *ring.Allocator) {
				r := a.Ring()
				if o, _ := r.Owner(got.Addr()); o != full.self {
					t.Fatalf("requester's ring gives %v to %q", got, o)
				}
				if _, err := a.Allocate(ring.Attachment{ContainerID: "new"}, got); err != nil {
					t.Fatalf("requester cannot allocate in %v: %v", got, err)
				}
			})
			for _, p := range peers[1:] {
				p.View(func(a *ring.Allocator) {
					for _, l := range leases {
						if l.Owner == p.self && l.Prefix.Contains(got.Addr()) {
							donor = p.self
							if o, _ := a.Ring().Owner(got.Addr()); o != full.self {
								t.Fatalf("donor's ring gives %v to %q", got, o)
							}
						}
					}
				})
			}
			if donor == "" {
				t.Fatalf("granted %v is in no donor's lease", got)
			}
			converge(t, n, peers)
			checkDisjoint(t, tt.cfg.Seed, peers)
		})
	}
}

func TestSpaceRequestNoDonor(t *testing.T) {
	n := newNetwork(t, fakegossip.Config{Seed: 20})
	peers := joinPeers(t, n, 2)
	if _, err := peers[0].RequestSpace(bounded(t)); !errors.Is(err, ErrNoDonor) {
		t.Fatalf("RequestSpace with nobody owning anything = %v", err)
	}
	// A donor whose ring advertises space it has not got refuses; with no
	// other donor, the request ends with ErrNoDonor.
	l := []ring.Lease{lease(peers[1].self, 1, 30, 1)}
	for _, p := range peers {
		if err := p.Update(func(a *ring.Allocator) error { _, err := a.Seed(l, nil); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if err := peers[1].Update(func(a *ring.Allocator) error {
		for x := netip.MustParseAddr("10.128.1.0"); x.Compare(netip.MustParseAddr("10.128.1.3")) <= 0; x = x.Next() {
			if err := a.Reserve(x); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := peers[0].RequestSpace(bounded(t)); !errors.Is(err, ErrNoDonor) {
		t.Fatalf("RequestSpace from a full donor = %v", err)
	}
}

// TestRepeatedRequestGrantsOnce calls the donor's handler directly with the
// same request twice: one grant, two identical answers.
func TestRepeatedRequestGrantsOnce(t *testing.T) {
	n := newNetwork(t, fakegossip.Config{Seed: 30})
	peers := joinPeers(t, n, 2)
	donor := peers[1]
	l := []ring.Lease{lease(donor.self, 1, 24, 1)}
	if err := donor.Update(func(a *ring.Allocator) error { _, err := a.Seed(l, nil); return err }); err != nil {
		t.Fatal(err)
	}
	h := (*handler)(donor)
	req := request(1)
	for range 2 {
		if err := h.OnUnicast(peers[0].self, req); err != nil {
			t.Fatal(err)
		}
	}
	donor.View(func(a *ring.Allocator) {
		if got := a.Ring().RangesOf(peers[0].self); len(got) != 1 {
			t.Fatalf("requester owns %v after a repeated request", got)
		}
	})
	// A new request id is a new grant.
	if err := h.OnUnicast(peers[0].self, request(2)); err != nil {
		t.Fatal(err)
	}
	donor.View(func(a *ring.Allocator) {
		if got := a.Ring().RangesOf(peers[0].self); len(got) != 2 {
			t.Fatalf("requester owns %v after a second request", got)
		}
	})
}

func request(id uint64) []byte { return append([]byte{msgRequest}, byte(id)) }

// TestBadMessages feeds garbage to every handler entry: errors, no panic,
// and the ring does not move.
func TestBadMessages(t *testing.T) {
	n := newNetwork(t, fakegossip.Config{Seed: 40})
	peers := joinPeers(t, n, 2)
	p := peers[0]
	h := (*handler)(p)
	before := encoded(p)
	other, _ := ring.NewRing(netip.MustParsePrefix("10.0.0.0/8"))
	tests := []struct {
		name string
		msg  []byte
	}{
		{"empty", nil},
		{"unknown type", []byte{9}},
		{"request without id", []byte{msgRequest}},
		{"request with trailing bytes", []byte{msgRequest, 1, 2}},
		{"answer without status", []byte{msgAnswer, 1}},
		{"answer bad status", []byte{msgAnswer, 1, 7}},
		{"answer bad family", []byte{msgAnswer, 1, statusGranted, 5}},
		{"answer short address", []byte{msgAnswer, 1, statusGranted, 4, 10, 0}},
		{"answer host bits", []byte{msgAnswer, 1, statusGranted, 4, 10, 128, 0, 1, 24}},
		{"nothing with trailing bytes", []byte{msgAnswer, 1, statusNothing, 0}},
	}
	for _, tt := range tests {
		if err := h.OnUnicast("agent-01", tt.msg); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
	for _, msg := range [][]byte{nil, {1, 2, 3}, other.Encode()} {
		if d, err := h.OnGossip(msg); err == nil || d != nil {
			t.Errorf("OnGossip(%x) = %v, %v", msg, d, err)
		}
		if d, err := h.OnBroadcast("agent-01", msg); err == nil || d != nil {
			t.Errorf("OnBroadcast(%x) = %v, %v", msg, d, err)
		}
	}
	// A well-formed answer granting a prefix the ring does not give us
	// wakes nobody and changes nothing.
	if err := h.OnUnicast("agent-01", appendAnswer(nil, 99, netip.MustParsePrefix("10.128.5.0/25"), other.Encode())); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encoded(p), before) {
		t.Fatal("bad messages changed the ring")
	}
}

func TestRingDataMerge(t *testing.T) {
	a, _ := ring.NewRing(netip.MustParsePrefix(universe))
	b := a.Clone()
	if _, err := a.Seed([]ring.Lease{lease("x", 1, 24, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Seed([]ring.Lease{lease("y", 2, 24, 2)}, nil); err != nil {
		t.Fatal(err)
	}
	m := ringData{a.Encode()}.Merge(ringData{b.Encode()}).(ringData)
	r, err := ring.Decode(m.b)
	if err != nil {
		t.Fatal(err)
	}
	want := a.Clone()
	if _, err := want.Merge(b); err != nil {
		t.Fatal(err)
	}
	if !r.Equal(want) {
		t.Fatalf("coalesced data is not the join")
	}
	if got := (ringData{[]byte{1}}).Merge(ringData{b.Encode()}).(ringData); !bytes.Equal(got.b, b.Encode()) {
		t.Fatal("a bad pending ring was not replaced")
	}
}
