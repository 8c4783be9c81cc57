package raftlog

import (
	"errors"
	"sync"

	"github.com/hashicorp/raft"
)

// errStoreClosed answers a read of the stable store after Close.
var errStoreClosed = errors.New("raftlog: stable store closed")

// stableStore is the store raft keeps its term and vote in, closed by
// Node.Close rather than with the database beneath it. raft answers
// heartbeats on the transport's connection goroutines, which Shutdown does
// not wait for: a heartbeat that passed raft's shutdown check just before
// Shutdown can write a higher term after the database was closed, and raft
// panics when a term write fails ("failed to save current term: database
// not open", seen under -race on a loaded machine). Close waits for the
// writes in flight; a write after it is dropped, which loses nothing raft
// relies on: the node is shut down, and a term it never persisted is one it
// never voted in.
type stableStore struct {
	mu     sync.RWMutex
	closed bool
	store  raft.StableStore
}

var _ raft.StableStore = (*stableStore)(nil)

// Set stores a value unless the store is closed.
func (s *stableStore) Set(key, val []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.store.Set(key, val)
}

// Get reads a value.
func (s *stableStore) Get(key []byte) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, errStoreClosed
	}
	return s.store.Get(key)
}

// SetUint64 stores a number unless the store is closed.
func (s *stableStore) SetUint64(key []byte, val uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.store.SetUint64(key, val)
}

// GetUint64 reads a number.
func (s *stableStore) GetUint64(key []byte) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, errStoreClosed
	}
	return s.store.GetUint64(key)
}

// close waits for the calls in flight, then runs closeDB (which closes
// the database beneath) with every later call kept away from it.
func (s *stableStore) close(closeDB func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return closeDB()
}
