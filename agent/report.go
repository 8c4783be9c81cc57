package agent

import (
	"context"
	"encoding/json"
	"net/netip"

	"github.com/carve-net/carve/agent/kernel"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
)

// reportLoop sends the agent's configuration result to the masters when it
// changed (package report), retrying with backoff.
func (a *Agent) reportLoop(ctx context.Context) {
	a.reports.Run(ctx, retry.Backoff{First: firstRetry, Max: maxRetry}, func(ctx context.Context, req api.ReportRequest) error {
		if _, err := a.client.Report(ctx, a.id, req); err != nil {
			a.metrics.reports.WithLabelValues("error").Inc()
			a.log.Warn("report the configuration result to the masters", "version", req.Version, "err", err)
			return err
		}
		a.metrics.reports.WithLabelValues("ok").Inc()
		a.log.Debug("configuration reported", "version", req.Version, "overlays", req.Overlays, "attempts", req.ConfigurationAttempts)
		return nil
	})
}

// overlayResults is the local configuration result of every overlay of
// self: FAILED with the error when the agent refuses the masters' records
// (refusing: its kernel is as it was, taking no change), when the last
// reconcile failed for it (its VTEP, its bridges or their addresses) or its
// IPAM cannot serve it, CONFIGURING until the kernel holds this version of
// the record, OK then; last is the last reconcile's result, ipamErr the
// IPAM's (ipamErrors).
func overlayResults(self *api.AgentInfo, last *kernel.Result, refusing string, ipamErr map[string]string) []api.OverlayReport {
	out := make([]api.OverlayReport, 0, len(self.Overlays))
	for i := range self.Overlays {
		ov := &self.Overlays[i]
		r := api.OverlayReport{Name: ov.Info.Name, Status: api.StatusOK}
		switch msg := last.OverlayError(ov); {
		case refusing != "":
			// Not OK, though the kernel works with the peers it had: no
			// change of the masters reaches it (a new peer, a moved
			// lease), and ipam show must not say otherwise.
			r.Status, r.Error = api.StatusFailed, "refusing the masters' records, the kernel kept as it was: "+refusing
		case msg != "":
			r.Status, r.Error = api.StatusFailed, msg
		case last.Version < self.Version:
			// The kernel has not been worked on for this version yet (a
			// reconcile that failed for one overlay still configured the
			// others: their result is theirs).
			r.Status = api.StatusConfiguring
		case ipamErr[ov.Info.Name] != "" && ov.Info.IsEnabled():
			// A disabled overlay's IPAM refuses new containers by design
			// (a drain): configured as asked, not failed.
			r.Status, r.Error = api.StatusFailed, "IPAM: "+ipamErr[ov.Info.Name]
		}
		out = append(out, r)
	}
	return out
}

// ipamErrors is, per overlay of self, why its IPAM cannot allocate ("" when
// it can). It takes the IPAM's lock, not the agent's.
func (a *Agent) ipamErrors(self *api.AgentInfo) map[string]string {
	out := map[string]string{}
	if self == nil || a.ipam == nil {
		return out
	}
	for _, ov := range self.Overlays {
		if st := a.ipam.Status(ov.Info.Name); !st.Ready {
			out[ov.Info.Name] = st.Error
		}
	}
	return out
}

// noteReconciled records the result of a reconcile of self for the
// masters.
// With it go the signing key the agent verifies with, why it refuses the
// masters' records (then no peer count: it programs what it verified
// before), or else how many peers its kernel holds and from which
// masters' index.
func (a *Agent) noteReconciled(self *api.AgentInfo) {
	ipamErr := a.ipamErrors(self)
	last := a.kernel.Last()
	a.mu.RLock()
	req := api.ReportRequest{Version: self.Version, Overlays: overlayResults(self, last, a.refusing, ipamErr), Refusing: a.refusing}
	if a.signingKey != nil {
		req.SigningKey = api.EncodeSigningKey(a.signingKey)
	}
	if a.refusing == "" {
		n := last.ProgrammedCount()
		req.ProgrammedPeers, req.PeersIndex = &n, last.Index
	}
	a.mu.RUnlock()
	a.reports.Note(req)
}

// Overlay is the agent's record (DC/OS's agent endpoint: ip, overlays,
// configuration_attempts, and carve's extensions) with each overlay's
// local status: CONFIGURING until the kernel holds the current leases,
// FAILED with the error, OK once programmed and served by the IPAM.
func (a *Agent) Overlay() *api.AgentInfo {
	return a.overlayInfo()
}

// fillBlockCounts sets the used and free counts of an overlay's blocks from
// the IPAM's counts of the blocks its ring gives the agent (by prefix): a
// block's counts are those of the parts of it the agent holds; a block it
// holds none of (the ring moved it) stays without counts.
func fillBlockCounts(ov *api.AgentOverlay, counts map[string][2]uint64) {
	parsed := make(map[netip.Prefix][2]uint64, len(counts))
	for k, c := range counts {
		if p, err := netip.ParsePrefix(k); err == nil {
			parsed[p] = c
		}
	}
	for j := range ov.Blocks {
		b := &ov.Blocks[j]
		bp, err := netip.ParsePrefix(b.Prefix)
		if err != nil {
			continue
		}
		var used, free uint64
		found := false
		for p, c := range parsed {
			if bp.Bits() <= p.Bits() && bp.Contains(p.Addr()) {
				used, free, found = used+c[0], free+c[1], true
			}
		}
		if found {
			b.Used, b.Free = &used, &free
		}
	}
}

func (a *Agent) overlayInfo() *api.AgentInfo {
	a.mu.RLock()
	self := a.self
	a.mu.RUnlock()
	if self == nil {
		return &api.AgentInfo{AgentID: a.id, IP: a.ip.String(), MeshAddr: a.cfg.MeshAddr}
	}
	ipamErr := a.ipamErrors(self)
	var info api.AgentInfo
	data, _ := json.Marshal(self)
	_ = json.Unmarshal(data, &info)
	results := overlayResults(&info, a.kernel.Last(), a.refusingNow(), ipamErr)
	for i, r := range results {
		info.Overlays[i].State = api.OverlayState{Status: r.Status, Error: r.Error}
		fillBlockCounts(&info.Overlays[i], a.ipam.BlockCounts(info.Overlays[i].Info.Name))
	}
	info.ConfigurationAttempts = a.reports.ConfigurationAttempts(info.Version)
	return &info
}
