// Package groupcommit is the IPAM's group commit: requests decide their
// change in memory under their owner's lock, queue its writes into the open
// batch and wait for that batch to be durable; one goroutine at a time
// writes the open batch in one transaction (one fsync), so concurrent
// requests share fsyncs and every answer still comes only after its change
// is on disk. It knows nothing of what is written: the owner gives it the
// function that writes a batch's writes in one transaction.
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
package groupcommit

import "sync"

// Batch is the changes queued while the previous transaction was written.
type Batch[W any] struct {
	writes  []W
	pending []string // keys of the attachments it changes
	undo    []func() // take back the in-memory changes (run in reverse on failure)
	durable []func() // run once the transaction committed
	done    chan struct{}
	err     error
}

// Change is one request's part of a batch.
type Change[W any] struct {
	Key     string // the attachment it changes ("" for a ring)
	Writes  []W
	Undo    func()
	Durable func()
}

// NewBatch is an empty batch, for a caller that commits it itself under
// Quiesce (CommitQuiesced).
func NewBatch[W any]() *Batch[W] { return &Batch[W]{done: make(chan struct{})} }

// Add adds a change to the batch.
func (b *Batch[W]) Add(c Change[W]) {
	b.writes = append(b.writes, c.Writes...)
	if c.Key != "" {
		b.pending = append(b.pending, c.Key)
	}
	if c.Undo != nil {
		b.undo = append(b.undo, c.Undo)
	}
	if c.Durable != nil {
		b.durable = append(b.durable, c.Durable)
	}
}

// Queue is the open batch, the attachments with a change in flight, and
// the lock of the one goroutine writing a batch.
type Queue[W any] struct {
	mu       *sync.Mutex // the owner's lock: the state below and the in-memory changes
	commitMu sync.Mutex  // held by the one goroutine writing a batch
	open     *Batch[W]
	pending  map[string]*Batch[W] // key -> the batch with its change in flight
	write    func([]W) error
}

// New is a queue whose state is under mu (the owner's lock) and whose
// batches write writes each in one transaction.
func New[W any](mu *sync.Mutex, write func(writes []W) error) *Queue[W] {
	return &Queue[W]{mu: mu, pending: map[string]*Batch[W]{}, write: write}
}

// Enqueue adds a change to the open batch, marks its attachment pending and
// returns the batch. The caller holds the owner's lock, and calls Flush on
// the batch after leaving it.
func (q *Queue[W]) Enqueue(c Change[W]) *Batch[W] {
	if q.open == nil {
		q.open = NewBatch[W]()
	}
	q.open.Add(c)
	if c.Key != "" {
		q.pending[c.Key] = q.open
	}
	return q.open
}

// Flush returns once b is durable (nil) or taken back (its error). The
// first caller to get the commit lock writes the open batch, whoever
// queued it.
func (q *Queue[W]) Flush(b *Batch[W]) error {
	q.commitMu.Lock()
	defer q.commitMu.Unlock()
	select {
	case <-b.done: // a previous holder of commitMu wrote it
		return b.err
	default:
	}
	// b was open when queued, and only holders of commitMu take the open
	// batch (finishing it before they let go): b is still the open batch.
	q.mu.Lock()
	cur := q.open
	q.open = nil
	q.mu.Unlock()
	err := q.commit(cur)
	q.mu.Lock()
	q.finish(cur, err)
	q.mu.Unlock()
	return b.err
}

// Quiesce takes the commit lock and the owner's lock, committing the open
// batch first, so that no change is in flight while the caller reshapes
// the state (a rebuild, a sync). The caller unlocks the owner's lock, then
// calls Release.
func (q *Queue[W]) Quiesce() {
	q.commitMu.Lock()
	q.mu.Lock()
	if cur := q.open; cur != nil {
		q.open = nil
		q.finish(cur, q.commit(cur))
	}
}

// Release lets go of the commit lock Quiesce took.
func (q *Queue[W]) Release() { q.commitMu.Unlock() }

// CommitQuiesced writes and settles b, a batch of the caller's own (not
// the open one), and returns its error. The caller has quiesced.
func (q *Queue[W]) CommitQuiesced(b *Batch[W]) error {
	q.finish(b, q.commit(b))
	return b.err
}

// commit writes a batch in one transaction (one fsync).
func (q *Queue[W]) commit(b *Batch[W]) error {
	if len(b.writes) == 0 {
		return nil
	}
	return q.write(b.writes)
}

// finish settles a written batch: on failure its changes are taken back;
// either way its attachments stop being pending and its waiters wake. The
// caller holds the owner's lock.
func (q *Queue[W]) finish(b *Batch[W], err error) {
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
		if q.pending[k] == b {
			delete(q.pending, k)
		}
	}
	b.err = err
	close(b.done)
}

// Pending says whether an attachment has a change in flight. The caller
// holds the owner's lock.
func (q *Queue[W]) Pending(key string) bool { return q.pending[key] != nil }

// WaitPending waits, without the owner's lock, for the change in flight on
// an attachment; false when there is none (the lock still held). The
// caller holds the owner's lock and decides again after a true answer
// (the lock taken again).
func (q *Queue[W]) WaitPending(key string) bool {
	b := q.pending[key]
	if b == nil {
		return false
	}
	q.mu.Unlock()
	<-b.done
	q.mu.Lock()
	return true
}

// Queued is the number of attachments the open batch changes. The caller
// holds the owner's lock.
func (q *Queue[W]) Queued() int {
	if q.open == nil {
		return 0
	}
	return len(q.open.pending)
}
