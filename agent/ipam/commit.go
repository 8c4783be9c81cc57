package ipam

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/groupcommit"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
)

// The group commit (package groupcommit, under s.mu): a request decides its
// change in memory under s.mu, queues its writes (s.commits.Enqueue), leaves
// s.mu and waits for its batch to be durable (s.commits.Flush).

// batch is the changes queued while the previous transaction was written.
type batch = groupcommit.Batch[write]

// change is one request's part of a batch.
type change = groupcommit.Change[write]

// writeBatch writes a batch's writes in one transaction (one fsync).
func (s *Service) writeBatch(writes []write) error {
	start := time.Now()
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := ipamstore.Apply(tx, writes); err != nil {
			return err
		}
		if s.inTransaction != nil {
			return s.inTransaction() // tests: after the writes, so a failure really rolls them back
		}
		return nil
	})
	s.metrics.CommitSeconds.Observe(time.Since(start).Seconds())
	s.metrics.CommitWrites.Observe(float64(len(writes)))
	if err != nil {
		s.metrics.CommitErrors.Inc()
		s.log.Error("commit of allocations failed: taking them back", "writes", len(writes), "err", err)
	}
	return err
}
