package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/testutil"
)

// blockingSource is a TEST DOUBLE for the masters whose Grow blocks until
// the growth's context ends: a growth stays in flight until whoever owns
// it cancels it.
type blockingSource struct {
	mastersStandIn
	inGrow [2]atomic.Int32 // Grow calls not returned yet, IPv4 and IPv6
}

func (b *blockingSource) Grow(ctx context.Context, _, _ string, family int, _ string) (LeasedBlock, error) {
	n := &b.inGrow[ipfamily.Index(fmt.Sprint(family))]
	n.Add(1)
	defer n.Add(-1)
	<-ctx.Done()
	return LeasedBlock{}, fmt.Errorf("no master answered: %w", ctx.Err())
}

// hanging waits until a growth of each family hangs at the masters.
func (b *blockingSource) hanging(t *testing.T, families ...int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "growths hanging at the masters", func() error {
		for _, fam := range families {
			if b.inGrow[ipfamily.Index(fmt.Sprint(fam))].Load() == 0 {
				return fmt.Errorf("no IPv%d growth at the masters", fam)
			}
		}
		return nil
	})
}

func (b *blockingSource) inFlight() int32 { return b.inGrow[0].Load() + b.inGrow[1].Load() }

// inflightGrowths is the number of growths the service has in flight.
func (s *Service) inflightGrowths() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grower.InFlight()
}

// TestRunWaitsForTheGrowthInFlight: a growth in flight when Run's context
// ends (the masters not answering) has ended when Run returns, so that the
// agent closing its store next closes it under nothing.
func TestRunWaitsForTheGrowthInFlight(t *testing.T) {
	c := newCluster(t, 9, GrowthConfig{IdleReturn: -1, LowWater: 4})
	src := &blockingSource{}
	nd := c.startSource("a", t.TempDir(), src)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ran := make(chan struct{})
	go func() {
		nd.svc.Run(ctx)
		close(ran)
	}()
	// 26 of the mesos /27's 29 addresses: 3 left, below the low water
	// mark of 4: the bridge grows in the background.
	for i := range 26 {
		nd.alloc(t, fmt.Sprint("c", i))
	}
	src.hanging(t, 4)
	cancel()
	<-ran
	if n := src.inFlight(); n != 0 {
		t.Errorf("%d calls to the masters still in flight when Run returned", n)
	}
	if n := nd.svc.inflightGrowths(); n != 0 {
		t.Errorf("%d growths still in flight when Run returned", n)
	}
	// Stopped: an ADD that finds the bridge full starts no growth, and
	// says why: not ready (the runtime retries), not exhausted.
	for i := range 3 {
		nd.alloc(t, fmt.Sprint("last", i))
	}
	_, err := nd.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "more", IfName: "eth0", Bridge: api.BridgeMesos})
	if !api.IsCode(err, api.CodeNotReady) || !strings.Contains(err.Error(), "stopping") {
		t.Fatalf("an ADD on a full bridge after Run returned: %v; want not ready, saying the IPAM is stopping", err)
	}
	if n := nd.svc.inflightGrowths(); n != 0 {
		t.Errorf("%d growths started after Run returned", n)
	}
}

// TestNoDonationAfterClose: a space request that arrives once the service
// is closed starts no donation: nothing writes the store its owner closes
// next, and the request is refused with the reason.
func TestNoDonationAfterClose(t *testing.T) {
	c := newCluster(t, 10, GrowthConfig{IdleReturn: -1})
	b := c.startSource("b", t.TempDir(), &mastersStandIn{})
	var writes atomic.Int32
	b.svc.inTransaction = func() error { writes.Add(1); return nil }
	b.svc.Close()
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: "c1", From: "a", ID: "a-1", Overlay: "carve", Family: "4", Bits: 28}
	req.Sig = api.Sign(claimKeyOf("a"), ipamwire.SpaceRequestSigningBytes(req))
	err := b.svc.onSpaceMessage("a", ipamwire.EncodeSpaceMessage(req))
	if !errors.Is(err, errStopping) {
		t.Fatalf("a space request to a closed service: %v; want it refused as stopping", err)
	}
	b.svc.Close() // waits for any donation it would have started
	if n := writes.Load(); n != 0 {
		t.Fatalf("%d transactions after Close", n)
	}
}

// TestFullDualStackADDWaitsNoLongerThanWait: an ADD on a bridge full in
// IPv4 whose IPv4 and IPv6 growths both hang (masters that do not answer)
// returns after GrowthConfig.Wait, not after the second growth's own
// timeout: one bound for every growth it waits for.
func TestFullDualStackADDWaitsNoLongerThanWait(t *testing.T) {
	// A low water mark above the free space of both families' blocks
	// (the IPv6 one a /121 here): the first ADD starts both growths,
	// which hang.
	c := newCluster(t, 11, GrowthConfig{IdleReturn: -1, LowWater: 1000, Wait: 50 * time.Millisecond})
	src := &blockingSource{}
	nd := c.startSource("a", t.TempDir(), src)
	v := growthView("a")
	v.Self.Overlays[0].MesosBridge.IP6 = "fd00:0:0:1::/121"
	nd.svc.Sync(v)
	for i := range 29 {
		nd.alloc(t, fmt.Sprint("c", i))
	}
	src.hanging(t, 4, 6)
	var (
		mu   sync.Mutex
		done bool
		err  error
	)
	go func() {
		_, e := nd.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "more", IfName: "eth0", Bridge: api.BridgeMesos})
		mu.Lock()
		done, err = true, e
		mu.Unlock()
	}()
	testutil.Eventually(t, 10*time.Second, "the ADD on the full bridge answered within its Wait", func() error {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			return errors.New("still waiting for the growths")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if !api.IsCode(err, api.CodeExhausted) || !strings.Contains(err.Error(), "still growing") {
		t.Fatalf("the ADD: %v; want exhausted, still growing", err)
	}
	if n := src.inFlight(); n != 2 {
		t.Fatalf("%d growths hang at the masters, want both families' (the ADD must not have waited for them)", n)
	}
}

// TestUnreadableRingIsNotStartedFresh: an agent whose persisted ring
// cannot be read does not serve the overlay with a fresh ring, which would
// have forgotten the block it granted a peer (and handed its addresses out
// again): ADDs are refused with an error naming the store and the fix,
// and the next sync that can read the ring serves the overlay, the grant
// remembered.
func TestUnreadableRingIsNotStartedFresh(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.db")
	open := func() *bolt.DB {
		t.Helper()
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	start := func(db *bolt.DB) *Service {
		t.Helper()
		svc, err := New(Config{AgentID: "b", DB: db, Logger: testLogger(), Growth: GrowthConfig{IdleReturn: -1}, ClaimKey: claimKeyOf("b")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		return svc
	}
	// b grants a block to a: the grant lives in b's ring only.
	db := open()
	b := start(db)
	b.Sync(growthView("b"))
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: "c1", From: "a", ID: "a-1", Overlay: "carve", Family: "4", Bits: 28}
	ans, batch := b.decideDonation(req)
	if ans.Kind != ipamwire.KindGrant || batch == nil {
		t.Fatalf("answer %+v", ans)
	}
	if err := b.commits.Flush(batch); err != nil {
		t.Fatal(err)
	}
	granted := netip.MustParsePrefix(ans.Prefix)
	b.Close()
	db.Close()

	// b restarts, and its store cannot be read when the overlay starts.
	db = open()
	b = start(db)
	db.Close()
	b.Sync(growthView("b"))
	b.mu.Lock()
	fresh := b.overlays["carve"].Alloc[0] != nil
	b.mu.Unlock()
	if fresh {
		t.Error("the overlay's IPv4 ring started fresh, without the grant to a")
	}
	_, err := b.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "c", IfName: "eth0", Bridge: api.BridgeDocker})
	if !api.IsCode(err, api.CodeNotReady) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "persisted ring could not be read") ||
		!strings.Contains(err.Error(), "do not delete it") {
		t.Fatalf("an ADD with the ring unread: %v; want not ready, naming %s and the fix", err, path)
	}

	// Readable again (a stand-in for a fixed disk: the same file, opened
	// anew): the next sync reads the ring and the grant is still a's.
	b.db = open()
	b.Sync(growthView("b"))
	b.mu.Lock()
	owner, _ := b.overlays["carve"].Alloc[0].Ring().Owner(granted.Addr())
	b.mu.Unlock()
	if owner != "a" {
		t.Fatalf("after the ring was read, %s is %q's; want a's (granted)", granted.Addr(), owner)
	}
	// Every address b has left: none in what it granted.
	for i := 0; ; i++ {
		a, err := b.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("c", i), IfName: "eth0", Bridge: []string{api.BridgeDocker, api.BridgeMesos}[i%2]})
		if api.IsCode(err, api.CodeExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range a.IPs {
			if p := netip.MustParsePrefix(ip.Address); granted.Contains(p.Addr()) {
				t.Fatalf("%s handed out, in the block granted to a", p.Addr())
			}
		}
	}
}
