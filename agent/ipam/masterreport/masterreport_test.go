package masterreport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/api"
)

// fakeHost is an outbox in memory and a usage report.
type fakeHost struct {
	outbox []ipamstore.OutboxEntry
	usage  api.UsageReport
}

func (h *fakeHost) Outbox() ([]ipamstore.OutboxEntry, error) { return slices.Clone(h.outbox), nil }

func (h *fakeHost) Sent(id string) error {
	h.outbox = slices.DeleteFunc(h.outbox, func(e ipamstore.OutboxEntry) bool { return e.RequestID == id })
	return nil
}

func (h *fakeHost) Usage() (api.UsageReport, bool) { return h.usage, true }

// fakeMasters answers each request id as told (nil: taken).
type fakeMasters struct {
	answers map[string]error
	got     []string
}

func (m *fakeMasters) Return(_ context.Context, e ipamstore.OutboxEntry) error {
	m.got = append(m.got, "return "+e.RequestID)
	return m.answers[e.RequestID]
}

func (m *fakeMasters) ReportGrant(_ context.Context, e ipamstore.OutboxEntry) error {
	m.got = append(m.got, "grant "+e.RequestID)
	return m.answers[e.RequestID]
}

func reportsCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_reports_total"}, []string{"kind", "result"})
}

// TestOutbox: reports go in order; one refused for good is dropped, one
// that fails stops the rest and stays, with a retry delay.
func TestOutbox(t *testing.T) {
	p := netip.MustParsePrefix("10.128.0.0/28")
	h := &fakeHost{outbox: []ipamstore.OutboxEntry{
		{Kind: ipamstore.OutboxGrant, Prefix: p, RequestID: "1"},
		{Kind: ipamstore.OutboxReturn, Prefix: p, RequestID: "2"},
		{Kind: ipamstore.OutboxGrant, Prefix: p, RequestID: "3"},
		{Kind: ipamstore.OutboxGrant, Prefix: p, RequestID: "4"},
	}}
	m := &fakeMasters{answers: map[string]error{"2": fmt.Errorf("%w: conflict", ErrRefused), "3": errors.New("no leader")}}
	r := New(Config{Host: h, Masters: m, Reports: reportsCounter(), Log: slog.New(slog.DiscardHandler), Interval: -1})
	if wait := r.Send(t.Context(), time.Now()); wait <= 0 {
		t.Errorf("a failed report: retry in %v", wait)
	}
	if want := []string{"grant 1", "return 2", "grant 3"}; !slices.Equal(m.got, want) {
		t.Errorf("sent %v, want %v", m.got, want)
	}
	if len(h.outbox) != 2 || h.outbox[0].RequestID != "3" {
		t.Errorf("outbox left %+v, want 3 and 4", h.outbox)
	}
	delete(m.answers, "3")
	if wait := r.Send(t.Context(), time.Now()); wait != 0 || len(h.outbox) != 0 {
		t.Errorf("after the masters came back: retry in %v, outbox %+v", wait, h.outbox)
	}
}

// TestUsageDue: a usage report goes when none was taken yet, when it
// changed and Interval passed, or when Refresh passed; one the masters
// answer with unknown blocks is sent again at the next chance.
func TestUsageDue(t *testing.T) {
	h := &fakeHost{usage: api.UsageReport{StateIndex: 1}}
	var sent []uint64
	unknown := false
	r := New(Config{Host: h, Reports: reportsCounter(), Log: slog.New(slog.DiscardHandler), Interval: time.Second, Refresh: time.Minute,
		Usage: func(_ context.Context, u api.UsageReport) (*api.UsageAnswer, error) {
			sent = append(sent, u.StateIndex)
			if unknown {
				return &api.UsageAnswer{Unknown: []string{"10.128.0.0/28"}}, nil
			}
			return &api.UsageAnswer{}, nil
		}})
	t0 := time.Unix(1_700_000_000, 0)
	step := func(at time.Duration, index uint64) {
		t.Helper()
		h.usage.StateIndex = index
		if wait := r.Send(t.Context(), t0.Add(at)); wait != 0 {
			t.Fatalf("retry in %v without an outbox", wait)
		}
	}
	step(0, 1)                    // the first: sent
	step(500*time.Millisecond, 2) // changed, within Interval: not yet
	step(2*time.Second, 2)        // changed, Interval passed: sent
	step(3*time.Second, 2)        // unchanged: not sent
	step(2*time.Minute, 2)        // Refresh passed: sent
	unknown = true
	step(2*time.Minute+2*time.Second, 3) // sent, the masters lack a block
	unknown = false
	step(2*time.Minute+2100*time.Millisecond, 3) // sent again at once
	if want := []uint64{1, 2, 2, 3, 3}; !slices.Equal(sent, want) {
		t.Errorf("reports sent at state indexes %v, want %v", sent, want)
	}
}
