package groupcommit

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

// TestFlush: a batch is written once, in one call, with every queued
// write; a failed write takes back the batch's changes in reverse order
// and answers each with the error; either way its attachments stop being
// pending.
func TestFlush(t *testing.T) {
	errDisk := errors.New("disk full")
	for _, tc := range []struct {
		name        string
		writeErr    error
		wantUndone  []string
		wantDurable []string
	}{
		{"durable", nil, nil, []string{"a", "b"}},
		{"taken back", errDisk, []string{"b", "a"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var written [][]string
			q := New(&mu, func(ws []string) error {
				written = append(written, slices.Clone(ws))
				return tc.writeErr
			})
			var undone, durable []string
			change := func(key string) Change[string] {
				return Change[string]{Key: key, Writes: []string{"put " + key},
					Undo: func() { undone = append(undone, key) }, Durable: func() { durable = append(durable, key) }}
			}
			mu.Lock()
			b := q.Enqueue(change("a"))
			if q.Enqueue(change("b")) != b {
				t.Fatal("a second change opened another batch")
			}
			if !q.Pending("a") || !q.Pending("b") || q.Queued() != 2 {
				t.Fatalf("pending a %v, b %v, queued %d: want both pending, 2 queued", q.Pending("a"), q.Pending("b"), q.Queued())
			}
			mu.Unlock()
			if err := q.Flush(b); !errors.Is(err, tc.writeErr) || (err == nil) != (tc.writeErr == nil) {
				t.Fatalf("Flush: %v, want %v", err, tc.writeErr)
			}
			if err := q.Flush(b); !errors.Is(err, tc.writeErr) || (err == nil) != (tc.writeErr == nil) {
				t.Fatalf("Flush again: %v, want %v", err, tc.writeErr)
			}
			if want := [][]string{{"put a", "put b"}}; !slices.EqualFunc(written, want, slices.Equal[[]string]) {
				t.Errorf("written %v, want %v (one transaction)", written, want)
			}
			if !slices.Equal(undone, tc.wantUndone) || !slices.Equal(durable, tc.wantDurable) {
				t.Errorf("undone %v, durable %v; want %v, %v", undone, durable, tc.wantUndone, tc.wantDurable)
			}
			mu.Lock()
			defer mu.Unlock()
			if q.Pending("a") || q.Pending("b") || q.WaitPending("a") {
				t.Error("an attachment is still pending after its batch was settled")
			}
		})
	}
}

// TestQuiesce: Quiesce writes the open batch before it returns, and
// CommitQuiesced writes a batch of the caller's own.
func TestQuiesce(t *testing.T) {
	var mu sync.Mutex
	var written [][]int
	q := New(&mu, func(ws []int) error { written = append(written, slices.Clone(ws)); return nil })
	mu.Lock()
	q.Enqueue(Change[int]{Key: "x", Writes: []int{1}})
	mu.Unlock()
	q.Quiesce()
	if q.Pending("x") {
		t.Error("x still pending after Quiesce")
	}
	own := NewBatch[int]()
	own.Add(Change[int]{Writes: []int{2, 3}})
	own.Add(Change[int]{}) // nothing to write
	if err := q.CommitQuiesced(own); err != nil {
		t.Fatalf("CommitQuiesced: %v", err)
	}
	if err := q.CommitQuiesced(NewBatch[int]()); err != nil {
		t.Fatalf("CommitQuiesced of an empty batch: %v", err)
	}
	mu.Unlock()
	q.Release()
	if want := [][]int{{1}, {2, 3}}; !slices.EqualFunc(written, want, slices.Equal[[]int]) {
		t.Errorf("written %v, want %v (an empty batch writes nothing)", written, want)
	}
}
