package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/testutil"
)

// gate holds the first transaction (inside it, after its writes) until
// open is closed, then ends it with first; later transactions end with rest.
type gate struct {
	entered, open chan struct{}
	calls         atomic.Int32
	first, rest   error
}

func newGate(first, rest error) *gate {
	return &gate{entered: make(chan struct{}), open: make(chan struct{}), first: first, rest: rest}
}

func (g *gate) inTransaction() error {
	if g.calls.Add(1) == 1 {
		close(g.entered)
		<-g.open
		return g.first
	}
	return g.rest
}

// queued is the number of attachments in the open batch.
func queued(s *Service) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits.Queued()
}

// histogram reads a histogram of the harness's registry: samples and sum.
func (h *harness) histogram(name string) (count uint64, sum float64) {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			hist := mf.GetMetric()[0].GetHistogram()
			return hist.GetSampleCount(), hist.GetSampleSum()
		}
	}
	return 0, 0
}

// inParallel runs op(i) for i in [from, to) at once; errs[i] gets its error.
func inParallel(from, to int, op func(i int) error, errs []error) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := from; i < to; i++ {
		wg.Go(func() { errs[i] = op(i) })
	}
	return &wg
}

// TestGroupCommitSharesOneTransaction: the requests that arrive while a
// transaction is written are all committed by the next one, and every
// answer is durable: a restart finds each.
func TestGroupCommitSharesOneTransaction(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, harnessOptions{})
	const n = 40
	got := make([]*api.Allocation, n)
	errs := make([]error, n)
	allocate := func(i int) error {
		a, err := h.svc.Allocate(req(fmt.Sprintf("c%02d", i)))
		got[i] = a
		return err
	}
	g := newGate(nil, nil)
	h.svc.inTransaction = g.inTransaction
	commits0, writes0 := h.histogram("carve_agent_ipam_commit_writes")
	first := inParallel(0, 1, allocate, errs)
	<-g.entered
	rest := inParallel(1, n, allocate, errs)
	testutil.Eventually(t, 0, "every other allocation queued behind the first transaction", testutil.True(func() bool { return queued(h.svc) == n-1 }))
	close(g.open)
	first.Wait()
	rest.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	commits, writes := h.histogram("carve_agent_ipam_commit_writes")
	if commits-commits0 != 2 || writes-writes0 != n {
		t.Errorf("%d allocations took %d transactions of %v writes, want 2 transactions", n, commits-commits0, writes-writes0)
	}
	seen := map[string]int{}
	for i, a := range got {
		if j, dup := seen[addrs(a)]; dup {
			t.Errorf("%s given to c%02d and c%02d", addrs(a), j, i)
		}
		seen[addrs(a)] = i
	}
	want := h.svc.List("")
	h.close()
	h2 := newHarness(t, dir, harnessOptions{})
	for i, a := range got {
		if again, err := h2.svc.Lookup(req(fmt.Sprintf("c%02d", i))); err != nil || addrs(again) != addrs(a) {
			t.Errorf("c%02d after a restart: %v %v, want %s", i, again, err, addrs(a))
		}
	}
	if after := h2.svc.List(""); !reflect.DeepEqual(after, want) {
		t.Errorf("allocations after a restart differ:\n%+v\nwant\n%+v", after, want)
	}
}

// TestGroupCommitFailure: a failed transaction answers every request in it
// with an error and takes back their changes: memory equals disk, and the
// addresses they took or freed are as before.
func TestGroupCommitFailure(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, harnessOptions{})
	for i := range 6 {
		h.alloc(fmt.Sprintf("old%d", i), "eth0", "")
	}
	before := h.svc.List("")
	injected := errors.New("injected disk failure")
	g := newGate(injected, injected)
	h.svc.inTransaction = g.inTransaction
	// Allocations, releases, a release by address and a gc, all at once.
	ops := []func() error{
		func() error { _, err := h.svc.Allocate(req("new0")); return err },
		func() error { _, err := h.svc.Release(req("old0")); return err },
		func() error { _, err := h.svc.Allocate(req("new1")); return err },
		func() error { _, err := h.svc.Release(req("old1")); return err },
		func() error {
			_, err := h.svc.ReleaseAddress("carve", mustAddr(t, before.Allocations[2].IPs[0].Address))
			return err
		},
		func() error { _, err := h.svc.Allocate(req("new2")); return err },
		func() error {
			_, err := h.svc.GC(api.GCRequest{Network: "carve", Keep: []api.IPAMRequest{{ContainerID: "old0"}, {ContainerID: "old1"}, {ContainerID: "old2"}, {ContainerID: "old3"}}})
			return err
		},
	}
	errs := make([]error, len(ops))
	run := func(i int) error { return ops[i]() }
	first := inParallel(0, 1, run, errs)
	<-g.entered
	rest := inParallel(1, len(ops)-1, run, errs)
	testutil.Eventually(t, 0, "the other changes queued", testutil.True(func() bool { return queued(h.svc) == len(ops)-2 }))
	// The gc comes last: every attachment it would take is pending or kept but old4, old5.
	gc := inParallel(len(ops)-1, len(ops), run, errs)
	testutil.Eventually(t, 0, "the gc queued", testutil.True(func() bool { return queued(h.svc) == len(ops) }))
	close(g.open)
	first.Wait()
	rest.Wait()
	gc.Wait()
	for i, err := range errs {
		if !errors.Is(err, injected) && !api.IsCode(err, api.CodeInternal) {
			t.Errorf("op %d: %v, want the commit's failure", i, err)
		}
	}
	h.svc.inTransaction = nil
	if after := h.svc.List(""); !reflect.DeepEqual(after, before) {
		t.Fatalf("a failed commit left memory changed:\n%+v\nwant\n%+v", after, before)
	}
	checkAllocations(t, h.svc)
	// Only the bridges' gateways stay reserved (blocks.go: never handed out
	// nor donated).
	if r := h.svc.overlays["carve"].Alloc[0].Reserved(); fmt.Sprint(r) != "[10.128.2.1 10.128.3.1]" {
		t.Errorf("addresses left reserved: %v", r)
	}
	// The failed allocations freed their addresses (.8 to .10); only the
	// round-robin position moved past them.
	if got := h.alloc("next", "eth0", ""); got.IPs[0].Address != "10.128.2.11/24" {
		t.Errorf("next allocation %s, want 10.128.2.11/24", got.IPs[0].Address)
	}
	want := h.svc.List("")
	h.close()
	h2 := newHarness(t, dir, harnessOptions{})
	if got := h2.svc.List(""); !reflect.DeepEqual(got, want) {
		t.Errorf("disk differs from memory:\n%+v\nwant\n%+v", got, want)
	}
}

// TestReleaseNotReusedBeforeDurable: an address being released is handed
// to no one until the release is on disk. The release here fails: had the
// address been given out meanwhile, it would now be held twice.
func TestReleaseNotReusedBeforeDurable(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, harnessOptions{})
	held := h.alloc("old", "eth0", "")
	injected := errors.New("injected disk failure")
	g := newGate(injected, nil)
	h.svc.inTransaction = g.inTransaction
	errs := make([]error, 3)
	got := make([]*api.Allocation, 3)
	release := inParallel(0, 1, func(int) error { _, err := h.svc.Release(req("old")); return err }, errs)
	<-g.entered
	// While the release is in flight: another container allocates, and the
	// same attachment asks again (it waits for the release to settle).
	others := inParallel(1, 3, func(i int) error {
		var err error
		got[i], err = h.svc.Allocate(req([]string{"", "new", "old"}[i]))
		return err
	}, errs)
	testutil.Eventually(t, 0, "the new allocation queued", testutil.True(func() bool { return queued(h.svc) == 1 }))
	close(g.open)
	release.Wait()
	others.Wait()
	if !errors.Is(errs[0], injected) && !api.IsCode(errs[0], api.CodeInternal) {
		t.Errorf("release: %v, want the commit's failure", errs[0])
	}
	if errs[1] != nil || errs[2] != nil {
		t.Fatalf("allocations: %v", errors.Join(errs[1:]...))
	}
	if addrs(got[1]) == addrs(held) {
		t.Errorf("the address being released went to another container: %s", addrs(got[1]))
	}
	if addrs(got[2]) != addrs(held) {
		t.Errorf("the attachment whose release failed got %s, want its %s", addrs(got[2]), addrs(held))
	}
	checkAllocations(t, h.svc)
	want := h.svc.List("")
	h.close()
	h2 := newHarness(t, dir, harnessOptions{})
	if after := h2.svc.List(""); !reflect.DeepEqual(after, want) {
		t.Errorf("disk differs from memory:\n%+v\nwant\n%+v", after, want)
	}
}

func mustAddr(t *testing.T, prefix string) netip.Addr {
	t.Helper()
	p, err := netip.ParsePrefix(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return p.Addr()
}
