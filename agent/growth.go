package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
)

// masterBlocks is the IPAM's BlockSource and UsageReporter on the masters'
// client: grow, return and grant-report requests, and usage reports, made
// as this agent (its certificate), each with a request id kept across the
// client's failover retries.
type masterBlocks struct {
	id     string
	client *apiclient.Client
}

var (
	_ ipam.BlockSource   = (*masterBlocks)(nil)
	_ ipam.UsageReporter = (*masterBlocks)(nil)
)

// Grow implements ipam.BlockSource: 409 exhausted is
// ipam.ErrMastersExhausted, 409 quota ipam.ErrQuota; any other error sends
// the IPAM to the ring.
func (m *masterBlocks) Grow(ctx context.Context, overlay, bridge string, family int, requestID string) (ipam.LeasedBlock, error) {
	info, err := m.client.Grow(ctx, m.id, api.GrowRequest{Overlay: overlay, Bridge: bridge, Family: fmt.Sprint(family), RequestID: requestID})
	if err != nil {
		if api.IsCode(err, api.CodeExhausted) {
			return ipam.LeasedBlock{}, fmt.Errorf("%w: %v", ipam.ErrMastersExhausted, err)
		}
		if api.IsCode(err, api.CodeQuota) {
			return ipam.LeasedBlock{}, fmt.Errorf("%w: %w", ipam.ErrQuota, err)
		}
		return ipam.LeasedBlock{}, err
	}
	return grownBlock(info, overlay, bridge, family)
}

// grownBlock finds in the record a grow answered the block it leased: the
// bridge's grown block of the family with the highest version, and every
// block of the family (the agent's lease set at the record's version).
func grownBlock(info *api.AgentInfo, overlay, bridge string, family int) (ipam.LeasedBlock, error) {
	var out ipam.LeasedBlock
	for _, ov := range info.Overlays {
		if ov.Info.Name != overlay {
			continue
		}
		for _, b := range ov.Blocks {
			p, err := netip.ParsePrefix(b.Prefix)
			if err != nil || (family == 4) != p.Addr().Is4() {
				continue
			}
			out.Held = append(out.Held, p)
			if b.Bridge == bridge && b.Origin == api.BlockGrown && b.Version >= out.Version {
				out.Prefix, out.Version = p, b.Version
			}
		}
	}
	if !out.Prefix.IsValid() {
		return ipam.LeasedBlock{}, fmt.Errorf("the masters' answer to a grow of %s/%s lists no grown IPv%d block", overlay, bridge, family)
	}
	if info.Version >= out.Version {
		out.Version = info.Version // the lease set's version: the record's
	}
	return out, nil
}

// Return implements ipam.BlockSource.
func (m *masterBlocks) Return(ctx context.Context, r ipam.ReturnReport) error {
	_, err := m.client.ReturnBlock(ctx, m.id, api.ReturnRequest{Overlay: r.Overlay, Prefix: r.Prefix.String(), RequestID: r.RequestID,
		Version: r.Version, RestoreEpoch: r.RestoreEpoch})
	return refusedForGood(err)
}

// ReportGrant implements ipam.BlockSource. A 403 to a report whose donor's
// statement has expired is refused for good: no resend can change it, and
// the outbox would send nothing after it.
func (m *masterBlocks) ReportGrant(ctx context.Context, g ipam.GrantReport) error {
	_, err := m.client.ReportGrant(ctx, m.id, api.GrantReport{Overlay: g.Overlay, Prefix: g.Prefix.String(), Donor: g.Donor,
		Recipient: g.Recipient, Bridge: g.Bridge, RequestID: g.RequestID, Expires: g.Expires, DonorSignature: g.DonorSignature})
	if api.IsCode(err, api.CodeForbidden) && g.Expires != 0 && time.Now().Unix() > g.Expires {
		return fmt.Errorf("%w: the donor's statement expired at %s: %w", ipam.ErrReportRefused, time.Unix(g.Expires, 0).UTC().Format(time.RFC3339), err)
	}
	return refusedForGood(err)
}

// ReportUsage implements ipam.UsageReporter.
func (m *masterBlocks) ReportUsage(ctx context.Context, r api.UsageReport) (*api.UsageAnswer, error) {
	return m.client.ReportUsage(ctx, m.id, r)
}

// refusedForGood marks an answer that sending again cannot change (a 4xx
// other than a missing leader or a timeout) as ipam.ErrReportRefused.
func refusedForGood(err error) error {
	var e *api.Error
	if err == nil || api.IsRetryable(err) || !errors.As(err, &e) || e.Status < http.StatusBadRequest || e.Status >= http.StatusInternalServerError {
		return err
	}
	if e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden {
		return err // a certificate problem an operator fixes: keep the report
	}
	return fmt.Errorf("%w: %w", ipam.ErrReportRefused, err)
}
