// Package masterreport is what an agent's IPAM tells the masters of its
// own accord, and when: the reports of its outbox (grants made through
// the ring, reported on behalf of their recipient, and grown blocks given
// back), sent in order until one fails, each deleted once the masters took
// it or refused it for good, retried with backoff; then the usage report
// of its blocks (docs/design.md, obligation 3: complete, composed by its
// owner), sent when it changed since the last one the masters took, at
// most every Interval, and at least every Refresh. The outbox itself is
// written by its owner in the same group commit as the change it reports
// (package ipamstore's OutboxEntry).
//
// Its exported surface is this file.
package masterreport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
)

// ErrRefused is a Masters' answer when the masters refused a grant report
// or a return for good (not worth sending again).
var ErrRefused = errors.New("refused by the masters")

// callTimeout bounds one report to the masters.
const callTimeout = 10 * time.Second

// Masters is the masters' side of the reports.
type Masters interface {
	// Return gives a grown block back to the masters' free pool.
	Return(ctx context.Context, e ipamstore.OutboxEntry) error
	// ReportGrant tells the masters of a grant made through the ring.
	ReportGrant(ctx context.Context, e ipamstore.OutboxEntry) error
}

// Host is the owner of the outbox and the blocks (the IPAM).
type Host interface {
	// Outbox reads the pending reports, in request id order.
	Outbox() ([]ipamstore.OutboxEntry, error)
	// Sent deletes a report from the outbox, durably.
	Sent(requestID string) error
	// Usage composes the complete usage report; false before the owner
	// learned the masters' state (nothing to report yet).
	Usage() (api.UsageReport, bool)
}

// Config configures a Reporter.
type Config struct {
	Host Host
	// Masters receive the outbox; nil: no reports at all.
	Masters Masters
	// Usage sends a usage report and returns the masters' answer; nil:
	// none.
	Usage func(ctx context.Context, r api.UsageReport) (*api.UsageAnswer, error)
	// Interval is the least time between two usage reports (negative:
	// none); Refresh the most.
	Interval, Refresh time.Duration
	// Reports counts the reports by kind (grant, return, usage) and
	// result (ok, error, refused).
	Reports *prometheus.CounterVec
	Log     *slog.Logger
}

// Reporter sends the reports; one goroutine (its owner's loop) calls Send.
type Reporter struct {
	cfg     Config
	kick    chan struct{}
	backoff *retry.Backoff
	// last is the last usage report the masters took, lastSent when the
	// last one was sent.
	last     *api.UsageReport
	lastSent time.Time
}

// New returns a reporter.
func New(cfg Config) *Reporter {
	return &Reporter{cfg: cfg, kick: make(chan struct{}, 1), backoff: &retry.Backoff{First: time.Second, Max: time.Minute}}
}

// Kick asks the owner's loop to Send now (Kicked): the outbox grew.
func (r *Reporter) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Kicked fires after Kick.
func (r *Reporter) Kicked() <-chan struct{} { return r.kick }

// Send sends the outbox and then, if it went through, the usage report
// when it is due (grants go to the masters before a usage report lists
// them). It returns how long to wait before trying again when the outbox
// did not go through (0: it did).
func (r *Reporter) Send(ctx context.Context, now time.Time) (retryIn time.Duration) {
	if err := r.FlushOutbox(ctx); err != nil {
		return r.backoff.Next()
	}
	r.backoff.Reset()
	if err := r.sendUsage(ctx, now); err != nil {
		r.cfg.Log.Debug("usage report to the masters", "err", err)
	}
	return 0
}

// FlushOutbox sends every pending report; it stops at the first failure
// (the masters are unreachable: the caller retries later).
func (r *Reporter) FlushOutbox(ctx context.Context) error {
	src := r.cfg.Masters
	if src == nil {
		return nil
	}
	entries, err := r.cfg.Host.Outbox()
	if err != nil {
		return err
	}
	for _, e := range entries {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		switch e.Kind {
		case ipamstore.OutboxReturn:
			err = src.Return(cctx, e)
		default:
			err = src.ReportGrant(cctx, e)
		}
		cancel()
		switch {
		case err != nil && !errors.Is(err, ErrRefused):
			r.cfg.Reports.WithLabelValues(e.Kind, "error").Inc()
			return fmt.Errorf("report %s of %s to the masters: %w", e.Kind, e.Prefix, err)
		case err != nil:
			// The masters refused it for good (a conflict names the other
			// holder): retrying would block every later report.
			r.cfg.Reports.WithLabelValues(e.Kind, "refused").Inc()
			r.cfg.Log.Error("the masters refused a report: dropped", "kind", e.Kind, "overlay", e.Overlay, "block", e.Prefix, "err", err)
		default:
			r.cfg.Reports.WithLabelValues(e.Kind, "ok").Inc()
		}
		if err := r.cfg.Host.Sent(e.RequestID); err != nil {
			return err
		}
	}
	return nil
}

// sendUsage sends a usage report when it changed since the last one the
// masters took and Interval has passed, or Refresh has.
func (r *Reporter) sendUsage(ctx context.Context, now time.Time) error {
	if r.cfg.Usage == nil || r.cfg.Interval < 0 {
		return nil
	}
	rep, ok := r.cfg.Host.Usage()
	if !ok {
		return nil
	}
	due := r.last == nil || now.Sub(r.lastSent) >= r.cfg.Refresh ||
		(now.Sub(r.lastSent) >= r.cfg.Interval && !reflect.DeepEqual(r.last, &rep))
	if !due {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	ans, err := r.cfg.Usage(cctx, rep)
	if err != nil {
		r.cfg.Reports.WithLabelValues("usage", "error").Inc()
		return err
	}
	r.cfg.Reports.WithLabelValues("usage", "ok").Inc()
	r.lastSent = now
	if len(ans.Unknown) > 0 {
		// Grants not reported yet: the outbox sends them; report again soon.
		r.cfg.Log.Debug("the masters do not know some blocks yet", "blocks", ans.Unknown)
		r.last = nil
		return nil
	}
	r.last = &rep
	return nil
}
