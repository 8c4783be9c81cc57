package changelog

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSince: the ids changed after an index, each once and sorted; a
// change of every record makes the answer "all".
func TestSince(t *testing.T) {
	l := New(100)
	l.Add(2, []string{"b"}, false)
	l.Add(3, []string{"a", "c"}, false)
	l.Add(5, []string{"b"}, false)
	l.Add(7, nil, true)
	l.Add(8, []string{"d"}, false)
	tests := []struct {
		since uint64
		ids   []string
		all   bool
	}{
		{0, nil, true},
		{6, nil, true},
		{7, []string{"d"}, false},
		{8, nil, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.since), func(t *testing.T) {
			ids, all := l.Since(tt.since)
			if all != tt.all || !slices.Equal(ids, tt.ids) {
				t.Errorf("Since(%d) = %v, %v; want %v, %v", tt.since, ids, all, tt.ids, tt.all)
			}
		})
	}
	l2 := New(100)
	l2.Add(2, []string{"b"}, false)
	l2.Add(3, []string{"a", "c"}, false)
	l2.Add(5, []string{"b"}, false)
	if ids, all := l2.Since(1); all || !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("Since(1) = %v, %v; want [a b c]", ids, all)
	}
}

// TestRestartAndTrim: a restart empties the log at an index; a trim drops
// what is at or below the horizon and never moves the start back.
func TestRestartAndTrim(t *testing.T) {
	l := New(100)
	l.Add(2, []string{"a"}, false)
	l.Add(4, []string{"b"}, false)
	l.Trim(3)
	if l.Start() != 3 {
		t.Errorf("start after Trim(3) = %d, want 3", l.Start())
	}
	if ids, _ := l.Since(3); !slices.Equal(ids, []string{"b"}) {
		t.Errorf("Since(3) after Trim(3) = %v, want [b]", ids)
	}
	l.Trim(1)
	if l.Start() != 3 {
		t.Errorf("Trim(1) moved the start to %d", l.Start())
	}
	l.Restart(9)
	if ids, all := l.Since(9); l.Start() != 9 || all || len(ids) != 0 {
		t.Errorf("after Restart(9): start %d, Since(9) = %v, %v", l.Start(), ids, all)
	}
}

// TestGoneError: the error names the oldest index served and is ErrGone.
func TestGoneError(t *testing.T) {
	var err error = &GoneError{Oldest: 42}
	var gone *GoneError
	if !errors.Is(err, ErrGone) || !errors.As(err, &gone) || gone.Oldest != 42 {
		t.Errorf("%v: want ErrGone with Oldest 42", err)
	}
}

// TestLogProperty: under random changes, trims and bounds, the log always
// answers, for every index from its start on, exactly the ids a log that
// kept everything answers, holds at most its bound of ids (beyond one
// entry), and only moves its start forward.
func TestLogProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for round := range 50 {
		bound := 1 + rng.IntN(20)
		l := New(bound)
		type change struct {
			index uint64
			ids   []string
			all   bool
		}
		var model []change
		var index, start uint64
		for range 200 {
			index += uint64(1 + rng.IntN(3))
			if rng.IntN(10) == 0 {
				l.Trim(index - min(index, uint64(rng.IntN(5))))
				if l.Start() < start {
					t.Fatalf("seed %d round %d: a trim moved the start back from %d to %d", seed, round, start, l.Start())
				}
				start = l.Start()
				continue
			}
			set := map[string]bool{}
			for range rng.IntN(5) {
				set[fmt.Sprintf("a%d", rng.IntN(30))] = true
			}
			c := change{index: index, ids: slices.Sorted(maps.Keys(set)), all: rng.IntN(20) == 0}
			model = append(model, c)
			l.Add(c.index, c.ids, c.all)
			if l.Start() < start {
				t.Fatalf("seed %d round %d: start moved back from %d to %d", seed, round, start, l.Start())
			}
			start = l.Start()
			if held := l.ids; held > bound && len(l.entries) > 1 {
				t.Fatalf("seed %d round %d: %d ids held, bound %d", seed, round, held, bound)
			}
			for since := start; since <= index; since++ {
				want := map[string]bool{}
				wantAll := false
				for _, m := range model {
					if m.index > since {
						wantAll = wantAll || m.all
						for _, id := range m.ids {
							want[id] = true
						}
					}
				}
				ids, all := l.Since(since)
				if all != wantAll || (!all && !slices.Equal(ids, slices.Sorted(maps.Keys(want)))) {
					t.Fatalf("seed %d round %d: Since(%d) = %v, %v; want %v, %v", seed, round, since, ids, all, slices.Sorted(maps.Keys(want)), wantAll)
				}
			}
		}
	}
}
