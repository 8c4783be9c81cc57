package reclaimwatch

import (
	"slices"
	"testing"
	"time"
)

// TestRecentReleasesExpire: a release is remembered for ReleaseMemory, a
// later release of the same attachment restarts it, an allocation forgets
// it, and Prune returns what it forgot (to delete from disk) once.
func TestRecentReleasesExpire(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var r Releases
	r.Mark("a", t0)
	r.Mark("b", t0)
	r.Mark("a", t0.Add(ReleaseMemory/2)) // released again
	r.Mark("c", t0.Add(ReleaseMemory/2))
	if !r.Forget("c") || r.Forget("c") { // allocated again
		t.Error("forget of c did not report its release once")
	}
	later := t0.Add(ReleaseMemory + time.Second)
	if got := r.Prune(later); !slices.Equal(got, []string{"b"}) {
		t.Errorf("prune forgot %v, want [b] (a's first release is superseded, c was allocated again)", got)
	}
	r.Mark("d", later)
	for _, tc := range []struct {
		key  string
		at   time.Time
		want bool
	}{
		{"a", later, true},
		{"a", t0.Add(ReleaseMemory*3/2 + time.Second), false},
		{"b", later, false},
		{"c", later, false},
		{"d", later, true},
		{"e", later, false},
	} {
		if got := r.Released(tc.key, tc.at); got != tc.want {
			t.Errorf("Released(%s, t0+%s) = %v, want %v", tc.key, tc.at.Sub(t0), got, tc.want)
		}
	}
	if got := r.Prune(later); len(got) != 0 {
		t.Errorf("a second Prune forgot %v", got)
	}
}
