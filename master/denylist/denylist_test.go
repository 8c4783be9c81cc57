package denylist

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/carve-net/carve/api"
)

// signalled tells whether a signal waits, taking it.
func signalled(l *List) bool {
	select {
	case <-l.Signals():
		return true
	default:
		return false
	}
}

// TestAddOnce: a serial is listed once (a repeat changes nothing and
// signals nothing); readers see it in the set and the state's field.
func TestAddOnce(t *testing.T) {
	l := New()
	if l.Field() != nil || l.IsRevoked("a") || signalled(l) {
		t.Fatalf("a new list: field %q, a revoked %v", l.Field(), l.IsRevoked("a"))
	}
	if !l.Add(api.Revocation{Serial: "b", Index: 3}) || !l.Add(api.Revocation{Serial: "a", Identity: "agent/x", Index: 4}) {
		t.Fatal("a new serial was not added")
	}
	if !signalled(l) || signalled(l) {
		t.Error("two additions did not coalesce into one signal")
	}
	if l.Add(api.Revocation{Serial: "a", Index: 9}) || signalled(l) {
		t.Error("a repeated serial changed the list or signalled")
	}
	if want := `,"revoked":[{"serial":"a","identity":"agent/x","index":4},{"serial":"b","index":3}]`; string(l.Field()) != want {
		t.Errorf("field %s, want %s", l.Field(), want)
	}
	if !l.IsRevoked("a") || !l.IsRevoked("b") || l.IsRevoked("c") {
		t.Error("the set does not hold exactly a and b")
	}
}

// TestPrune: only revocations of certificates expired by now go, and only
// then does the list say it changed.
func TestPrune(t *testing.T) {
	l := New()
	l.Load([]api.Revocation{{Serial: "old", NotAfter: 100}, {Serial: "new", NotAfter: 300}, {Serial: "forever"}})
	tests := []struct {
		now    int64
		pruned bool
		left   []string
	}{
		{100, false, []string{"forever", "new", "old"}},
		{101, true, []string{"forever", "new"}},
		{200, false, []string{"forever", "new"}},
		{1 << 40, true, []string{"forever"}},
	}
	for _, tt := range tests {
		pruned := l.Prune(tt.now)
		var left []string
		for _, r := range l.Sorted() {
			left = append(left, r.Serial)
		}
		if pruned != tt.pruned || !slices.Equal(left, tt.left) {
			t.Errorf("Prune(%d) = %v, left %v; want %v, %v", tt.now, pruned, left, tt.pruned, tt.left)
		}
		if l.IsRevoked("old") != slices.Contains(tt.left, "old") {
			t.Errorf("after Prune(%d) the set disagrees on old", tt.now)
		}
	}
}

// TestResetLoadKeep: a reset empties the list but keeps its signal; a
// loaded snapshot signals only when it holds revocations; what is kept
// back from before a restore never replaces what the snapshot holds.
func TestResetLoadKeep(t *testing.T) {
	l := New()
	l.Add(api.Revocation{Serial: "a", Index: 5})
	signals := l.Signals()
	before := l.Sorted()
	l.Reset()
	if l.IsRevoked("a") || l.Field() != nil || l.Signals() != signals {
		t.Fatal("a reset list still holds a, or has another signal channel")
	}
	<-signals
	l.Load(nil)
	if signalled(l) {
		t.Error("an empty snapshot signalled")
	}
	l.Load([]api.Revocation{{Serial: "a", Index: 2}, {Serial: "b", Index: 3}})
	if !signalled(l) {
		t.Error("a snapshot with revocations did not signal")
	}
	l.Keep(append(before, api.Revocation{Serial: "c", Index: 7}))
	got := fmt.Sprint(l.Sorted())
	if want := fmt.Sprint([]api.Revocation{{Serial: "a", Index: 2}, {Serial: "b", Index: 3}, {Serial: "c", Index: 7}}); got != want {
		t.Errorf("after Keep: %s, want %s", got, want)
	}
	if signalled(l) {
		t.Error("Keep signalled")
	}
}

// TestIsRevokedWithoutLock: readers ask while the owner changes the list
// (run under -race).
func TestIsRevokedWithoutLock(t *testing.T) {
	l := New()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = l.IsRevoked("s7")
			}
		}
	})
	for i := range 50 {
		l.Add(api.Revocation{Serial: fmt.Sprintf("s%d", i), NotAfter: int64(i + 1)})
		l.Prune(int64(i / 2))
	}
	close(stop)
	wg.Wait()
	if !l.IsRevoked("s49") {
		t.Error("the last serial added is not revoked")
	}
}
