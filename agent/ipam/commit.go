package ipam

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
)

// Group commit. A request decides its change in memory under s.mu, queues
// the writes into the open batch, marks the attachment pending and leaves
// s.mu; then it waits for its batch to be durable. One goroutine at a time
// (the holder of s.commitMu) takes the open batch and writes it in one bbolt
// transaction, one fsync; the requests that queued meanwhile form the next
// batch. So concurrent requests share fsyncs, and every answer still comes
// only after its change is on disk.
//
// The rules that keep memory and disk equal:
//   - A failed transaction takes back the in-memory change of every request
//     in the batch (in reverse order) and answers them all with the error.
//   - An attachment with a change in flight is pending: any other request
//     on it waits until that change is durable or taken back, then decides
//     again. So one batch never holds two changes of one attachment, and no
//     one is answered from a change that may still be taken back.
//   - A released address is not free until its release is durable: it stays
//     reserved in the allocator meanwhile. Otherwise a later allocation
//     could hand it out in a batch that commits, after the release's batch
//     failed and gave the address back to its old holder: one address, two
//     containers, both on disk.
//   - Ring writes go through the same queue, so an allocation made in a
//     range the ring just gave this agent commits with that ring or after.

// batch is the changes queued while the previous transaction was written.
type batch struct {
	writes  []write
	pending []string // allocKeys of the attachments it changes
	undo    []func() // take back the in-memory changes (run in reverse on failure)
	durable []func() // run once the transaction committed
	done    chan struct{}
	err     error
}

// change is one request's part of a batch.
type change struct {
	key     string // the attachment it changes ("" for a ring)
	writes  []write
	undo    func()
	durable func()
}

func newBatch() *batch { return &batch{done: make(chan struct{})} }

// add adds a change to the batch.
func (b *batch) add(c change) {
	b.writes = append(b.writes, c.writes...)
	if c.key != "" {
		b.pending = append(b.pending, c.key)
	}
	if c.undo != nil {
		b.undo = append(b.undo, c.undo)
	}
	if c.durable != nil {
		b.durable = append(b.durable, c.durable)
	}
}

// enqueue adds a change to the open batch, marks its attachment pending and
// returns the batch. The caller holds s.mu, and calls s.flush on the batch
// after leaving it.
func (s *Service) enqueue(c change) *batch {
	if s.open == nil {
		s.open = newBatch()
	}
	s.open.add(c)
	if c.key != "" {
		s.pending[c.key] = s.open
	}
	return s.open
}

// flush returns once b is durable (nil) or taken back (its error). The
// first caller to get s.commitMu writes the open batch, whoever queued it.
func (s *Service) flush(b *batch) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	select {
	case <-b.done: // a previous holder of commitMu wrote it
		return b.err
	default:
	}
	// b was open when queued, and only holders of commitMu take the open
	// batch (finishing it before they let go): b is still the open batch.
	s.mu.Lock()
	cur := s.open
	s.open = nil
	s.mu.Unlock()
	err := s.commit(cur)
	s.mu.Lock()
	s.finish(cur, err)
	s.mu.Unlock()
	return b.err
}

// quiesce takes s.commitMu and s.mu, committing the open batch first, so
// that no change is in flight while the caller reshapes the state (a
// rebuild, a sync). The caller unlocks both.
func (s *Service) quiesce() {
	s.commitMu.Lock()
	s.mu.Lock()
	if cur := s.open; cur != nil {
		s.open = nil
		s.finish(cur, s.commit(cur))
	}
}

// commit writes a batch in one transaction (one fsync).
func (s *Service) commit(b *batch) error {
	if len(b.writes) == 0 {
		return nil
	}
	start := time.Now()
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := ipamstore.Apply(tx, b.writes); err != nil {
			return err
		}
		if s.inTransaction != nil {
			return s.inTransaction() // tests: after the writes, so a failure really rolls them back
		}
		return nil
	})
	s.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	s.metrics.commitWrites.Observe(float64(len(b.writes)))
	if err != nil {
		s.metrics.commitErrors.Inc()
		s.log.Error("commit of allocations failed: taking them back", "writes", len(b.writes), "err", err)
	}
	return err
}

// finish settles a written batch: on failure its changes are taken back;
// either way its attachments stop being pending and its waiters wake. The
// caller holds s.mu.
func (s *Service) finish(b *batch, err error) {
	if err != nil {
		for i := len(b.undo) - 1; i >= 0; i-- {
			b.undo[i]()
		}
	} else {
		for _, f := range b.durable {
			f()
		}
	}
	for _, k := range b.pending {
		if s.pending[k] == b {
			delete(s.pending, k)
		}
	}
	b.err = err
	close(b.done)
}

// waitPending waits, without s.mu, for the change in flight on an
// attachment; false when there is none (s.mu still held). The caller holds
// s.mu and decides again after a true answer (s.mu taken again).
func (s *Service) waitPending(key string) bool {
	b := s.pending[key]
	if b == nil {
		return false
	}
	s.mu.Unlock()
	<-b.done
	s.mu.Lock()
	return true
}
