package state

import (
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
	"github.com/carve-net/carve/master/snapshot"
)

// An agent's record, its blocks and its report are package record's, as
// is their rendering: the table decides what they hold. The quarantine's
// entries and the compaction's clock marks are the snapshot format's.
type (
	agentRecord  = record.Agent
	overlayLease = record.Lease
	leaseBlock   = record.Block
	agentReport  = record.Report
	quarantined  = snapshot.Quarantined
	clockMark    = snapshot.ClockMark
)

// render is rec in its API form, with the agent's last configuration
// report; the caller holds t.mu.
func (t *LeaseTable) render(rec *agentRecord) *api.AgentInfo {
	info := record.Render(t.net, rec)
	record.ApplyReport(info, t.reports[rec.ID], rec.Version)
	return info
}
