package ipam

// The reports to the masters (package masterreport): the outbox of grants
// made through the ring and blocks given back, written in the same group
// commit as the change it reports (ipamstore.OutboxEntry), and the usage
// reports; here is what they read and settle of the Service.

import (
	"context"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/masterreport"
	"github.com/carve-net/carve/api"
)

// newReporter returns the reporter of the Service's growth configuration.
func (s *Service) newReporter() *masterreport.Reporter {
	cfg := masterreport.Config{Host: (*reportHost)(s), Interval: s.grow.cfg.UsageInterval, Refresh: s.grow.cfg.UsageRefresh,
		Reports: s.metrics.Reports, Log: s.log}
	if src := s.grow.cfg.Source; src != nil {
		cfg.Masters = sourceReports{src}
	}
	if rep, ok := s.grow.cfg.Source.(UsageReporter); ok {
		cfg.Usage = rep.ReportUsage
	}
	return masterreport.New(cfg)
}

// sourceReports is a BlockSource as the reports' masters.
type sourceReports struct{ BlockSource }

func (m sourceReports) ReportGrant(ctx context.Context, e ipamstore.OutboxEntry) error {
	return m.BlockSource.ReportGrant(ctx, GrantReport{Overlay: e.Overlay, Prefix: e.Prefix, Donor: e.Donor, Recipient: e.Recipient, Bridge: e.Bridge,
		RequestID: e.RequestID, Expires: e.Expires, DonorSignature: e.DonorSignature})
}

func (m sourceReports) Return(ctx context.Context, e ipamstore.OutboxEntry) error {
	return m.BlockSource.Return(ctx, ReturnReport{Overlay: e.Overlay, Prefix: e.Prefix, RequestID: e.RequestID, Version: e.ReportedVersion(), RestoreEpoch: e.RestoreEpoch})
}

// reportHost is the Service as what its reports read and settle
// (masterreport.Host).
type reportHost Service

func (h *reportHost) Outbox() ([]ipamstore.OutboxEntry, error) { return ipamstore.ReadOutbox(h.db) }

func (h *reportHost) Sent(requestID string) error {
	s := (*Service)(h)
	s.mu.Lock()
	b := s.commits.Enqueue(change{Writes: []write{ipamstore.DeleteOutbox(requestID)}})
	s.mu.Unlock()
	return s.commits.Flush(b)
}

func (h *reportHost) Usage() (api.UsageReport, bool) {
	s := (*Service)(h)
	s.mu.Lock()
	synced := s.synced
	s.mu.Unlock()
	if !synced {
		return api.UsageReport{}, false
	}
	return s.usageReport(), true
}
