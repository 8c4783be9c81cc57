package ipam

import (
	"context"
	"slices"
	"time"

	"github.com/carve-net/carve/api"
)

// Usage reports. The agent tells the masters the used and free counts of
// every block it can allocate in (PUT .../usage), when they change (at most
// every UsageInterval) and at least every UsageRefresh. Every report is
// complete (docs/design.md, obligation 3): it lists every block the agent's
// ring lets it allocate in, composed under the IPAM lock from the state
// that merged the masters' state up to View.StateIndex, which it carries.
// The masters acknowledge the agent's holdings from it, and release the
// quarantined space of deleted agents once every live agent has.

// UsageReporter is the masters' side of usage reports; a BlockSource that
// implements it gets them.
type UsageReporter interface {
	// ReportUsage sends a report and returns the masters' answer.
	ReportUsage(ctx context.Context, r api.UsageReport) (*api.UsageAnswer, error)
}

// Defaults of the usage reports.
const (
	defaultUsageInterval = 5 * time.Second
	defaultUsageRefresh  = time.Minute
)

// tombstoned tells whether the masters deleted an agent, as far as the
// view says. The caller holds s.mu.
func (s *Service) tombstoned(id string) bool {
	return slices.ContainsFunc(s.view.Tombstones, func(t api.Tombstone) bool { return t.AgentID == id })
}

// usageReport composes a complete report of every served overlay: per
// known block (each bridge's first block and the blocks it holds), the
// parts the ring gives this agent, with their used and free counts.
func (s *Service) usageReport() api.UsageReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := api.UsageReport{StateIndex: s.view.StateIndex}
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		ou := api.OverlayUsage{Name: name, Blocks: []api.BlockUsage{}}
		for fam := range families {
			for _, p := range o.OwnedBlocks(fam) {
				used, free := o.Counts(fam, p)
				ou.Blocks = append(ou.Blocks, api.BlockUsage{Prefix: p.String(), Used: used, Free: free})
			}
		}
		r.Overlays = append(r.Overlays, ou)
	}
	return r
}

// BlockCounts returns the used and free counts of an overlay's blocks the
// ring gives this agent, by prefix (nil when the overlay is not served).
func (s *Service) BlockCounts(network string) map[string][2]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[network]
	if o == nil {
		return nil
	}
	out := map[string][2]uint64{}
	for fam := range families {
		for _, p := range o.OwnedBlocks(fam) {
			used, free := o.Counts(fam, p)
			out[p.String()] = [2]uint64{used, free}
		}
	}
	return out
}
