package growth

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeTable is a Table that records what growth asked of it.
type fakeTable struct {
	mu       *sync.Mutex
	added    []LeasedBlock
	asked    int
	grown    []error
	goErr    error
	wg       sync.WaitGroup
	askError error
}

func (f *fakeTable) AddGrownBlock(_ Key, lb LeasedBlock) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.added = append(f.added, lb)
	return nil
}

func (f *fakeTable) Ask(context.Context, Key, func(string)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.askError
}

func (f *fakeTable) RequestID() string      { return "req" }
func (f *fakeTable) Grown(_ Key, err error) { f.grown = append(f.grown, err) }
func (f *fakeTable) Go(fn func(context.Context)) error {
	if f.goErr != nil {
		return f.goErr
	}
	f.wg.Go(func() { fn(context.Background()) })
	return nil
}

// fakeSource is the masters, answering every grow with err or a block.
type fakeSource struct{ err error }

func (s fakeSource) Grow(context.Context, string, string, int, string) (LeasedBlock, error) {
	if s.err != nil {
		return LeasedBlock{}, s.err
	}
	return LeasedBlock{Prefix: netip.MustParsePrefix("10.0.1.0/26"), Version: 7}, nil
}
func (fakeSource) Return(context.Context, ReturnReport) error     { return nil }
func (fakeSource) ReportGrant(context.Context, GrantReport) error { return nil }

// TestRunner: a bridge below its low-water mark grows once (the masters
// first, a peer when they have nothing), a growth in flight is shared, and
// one that cannot start says why.
func TestRunner(t *testing.T) {
	errStopping := errors.New("stopping")
	for _, tc := range []struct {
		name      string
		source    BlockSource
		goErr     error
		wantErr   error
		wantAdded int
		wantAsked int
	}{
		{"from the masters", fakeSource{}, nil, nil, 1, 0},
		{"masters exhausted: a peer", fakeSource{err: ErrMastersExhausted}, nil, nil, 0, 1},
		{"quota: no peer either", fakeSource{err: ErrQuota}, nil, ErrQuota, 0, 0},
		{"no masters: a peer", nil, nil, nil, 0, 1},
		{"stopping", fakeSource{}, errStopping, errStopping, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			table := &fakeTable{mu: &mu, goErr: tc.goErr}
			m := Metrics{
				Grows:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "g"}, []string{"path", "result"}),
				Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"reason"}),
			}
			r := NewRunner(Config{Source: tc.source}.WithDefaults(), &mu, table, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
			k := Key{Overlay: "blue", Bridge: "mesos"}
			lw := r.LowWater(netip.MustParsePrefix("10.0.0.0/24"))
			mu.Lock()
			if g := r.Start(k, lw, lw); g != nil {
				t.Error("a bridge at its low-water mark grew")
			}
			g := r.Start(k, lw-1, lw)
			if tc.goErr == nil && r.Start(k, 0, lw) != g {
				t.Error("a second start did not share the growth in flight")
			}
			mu.Unlock()
			errs := r.Wait(context.Background(), []*Growth{g})
			table.wg.Wait()
			if tc.wantErr == nil && len(errs) != 0 || tc.wantErr != nil && (len(errs) != 1 || !errors.Is(errs[0], tc.wantErr)) {
				t.Fatalf("Wait: %v, want %v", errs, tc.wantErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(table.added) != tc.wantAdded || table.asked != tc.wantAsked {
				t.Errorf("added %d blocks, asked %d peers; want %d, %d", len(table.added), table.asked, tc.wantAdded, tc.wantAsked)
			}
			if r.InFlight() != 0 || r.Growing("blue", 0) {
				t.Error("a growth still in flight after it ended")
			}
		})
	}
}
