package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/internal/retry"
)

// The outbox holds what the masters must learn and may not be reachable
// for: grants made through the ring (reported on behalf of the recipient)
// and grown blocks given back. It is written in the same group commit as
// the change it reports, and emptied as the masters acknowledge.
const outboxBucket = "ipam-outbox" // request id -> outboxEntry

// Kinds of outbox entries.
const (
	outboxGrant  = "grant"
	outboxReturn = "return"
)

// outboxEntry is one report due to the masters.
type outboxEntry struct {
	Kind      string       `json:"kind"`
	Overlay   string       `json:"overlay"`
	Prefix    netip.Prefix `json:"prefix"`
	Donor     string       `json:"donor,omitempty"`
	Recipient string       `json:"recipient,omitempty"`
	Bridge    string       `json:"bridge,omitempty"`
	RequestID string       `json:"request_id"`
	// Expires and DonorSignature are a grant's signed statement (see
	// api.GrantSigningBytes), which the masters require of a recipient.
	Expires        int64  `json:"expires,omitempty"`
	DonorSignature string `json:"donor_signature,omitempty"`
	// Version is a returned grown block's lease version: until the masters
	// take the return, their record still lists the block, and a restart
	// must not take it back from that record (learnMasterBlocks).
	Version uint64 `json:"version,omitempty"`
}

// outboxCallTimeout bounds one report to the masters.
const outboxCallTimeout = 10 * time.Second

func putOutbox(e outboxEntry) write {
	data, _ := json.Marshal(e) // strings and a prefix: cannot fail
	return write{bucket: outboxBucket, key: e.RequestID, value: data}
}

func newOutboxBackoff() *retry.Backoff {
	return &retry.Backoff{First: time.Second, Max: time.Minute}
}

// kickOutbox makes Run send the outbox now.
func (s *Service) kickOutbox() {
	select {
	case s.grow.kick <- struct{}{}:
	default:
	}
}

// outbox reads the pending reports, in request id order.
func (s *Service) outbox() ([]outboxEntry, error) {
	var out []outboxEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(outboxBucket)).ForEach(func(k, v []byte) error {
			var e outboxEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("corrupt outbox entry %q: %w", k, err)
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}

// flushOutbox sends every pending report; it stops at the first failure
// (the masters are unreachable: the caller retries later).
func (s *Service) flushOutbox(ctx context.Context) error {
	src := s.grow.cfg.Source
	if src == nil {
		return nil
	}
	entries, err := s.outbox()
	if err != nil {
		return err
	}
	for _, e := range entries {
		cctx, cancel := context.WithTimeout(ctx, outboxCallTimeout)
		switch e.Kind {
		case outboxReturn:
			err = src.Return(cctx, e.Overlay, e.Prefix, e.RequestID)
		default:
			err = src.ReportGrant(cctx, GrantReport{Overlay: e.Overlay, Prefix: e.Prefix, Donor: e.Donor, Recipient: e.Recipient, Bridge: e.Bridge,
				RequestID: e.RequestID, Expires: e.Expires, DonorSignature: e.DonorSignature})
		}
		cancel()
		switch {
		case err != nil && !errors.Is(err, ErrReportRefused):
			s.metrics.reports.WithLabelValues(e.Kind, "error").Inc()
			return fmt.Errorf("report %s of %s to the masters: %w", e.Kind, e.Prefix, err)
		case err != nil:
			// The masters refused it for good (a conflict names the other
			// holder): retrying would block every later report.
			s.metrics.reports.WithLabelValues(e.Kind, "refused").Inc()
			s.log.Error("the masters refused a report: dropped", "kind", e.Kind, "overlay", e.Overlay, "block", e.Prefix, "err", err)
		default:
			s.metrics.reports.WithLabelValues(e.Kind, "ok").Inc()
		}
		s.mu.Lock()
		b := s.enqueue(change{writes: []write{{bucket: outboxBucket, key: e.RequestID}}})
		s.mu.Unlock()
		if err := s.flush(b); err != nil {
			return err
		}
	}
	return nil
}
