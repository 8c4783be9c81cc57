package ipam

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/internal/retry"
)

// The outbox holds what the masters must learn and may not be reachable
// for: grants made through the ring (reported on behalf of the recipient)
// and grown blocks given back (ipamstore.OutboxEntry). It is written in
// the same group commit as the change it reports, and emptied as the
// masters acknowledge.

// outboxCallTimeout bounds one report to the masters.
const outboxCallTimeout = 10 * time.Second

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

// flushOutbox sends every pending report; it stops at the first failure
// (the masters are unreachable: the caller retries later).
func (s *Service) flushOutbox(ctx context.Context) error {
	src := s.grow.cfg.Source
	if src == nil {
		return nil
	}
	entries, err := ipamstore.ReadOutbox(s.db)
	if err != nil {
		return err
	}
	for _, e := range entries {
		cctx, cancel := context.WithTimeout(ctx, outboxCallTimeout)
		switch e.Kind {
		case ipamstore.OutboxReturn:
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
		b := s.enqueue(change{writes: []write{ipamstore.DeleteOutbox(e.RequestID)}})
		s.mu.Unlock()
		if err := s.flush(b); err != nil {
			return err
		}
	}
	return nil
}
