package raftlog

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// A term written by a heartbeat that raced Close neither fails (raft would
// panic) nor reaches the closed database; what was written before Close is
// kept, and writes in flight finish before the database closes.
func TestStableStoreClosedUnderWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), raftDBFile)
	db, err := raftboltdb.New(raftboltdb.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	s := &stableStore{store: db}
	key := []byte("CurrentTerm")
	if err := s.SetUint64(key, 7); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*200)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if err := s.SetUint64([]byte("other"), uint64(w*1000+i)); err != nil {
					errs <- err
				}
			}
		}()
	}
	if err := s.close(db.Close); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a write racing Close failed (raft panics on a failed term write): %v", err)
	}
	if err := s.SetUint64(key, 9); err != nil {
		t.Errorf("a term write after Close: %v", err)
	}
	if _, err := s.GetUint64(key); !errors.Is(err, errStoreClosed) {
		t.Errorf("a read after Close: %v, want errStoreClosed", err)
	}
	db, err = raftboltdb.New(raftboltdb.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if got, err := db.GetUint64(key); err != nil || got != 7 {
		t.Errorf("term after reopening: %d, %v; want 7 (written before Close; the later write dropped)", got, err)
	}
}
