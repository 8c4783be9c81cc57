package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/carve-net/carve/agent/kernel"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
)

// reportTimeout bounds one report call to the masters.
const reportTimeout = 15 * time.Second

// reporter holds the agent's configuration result, as it reports it to the
// masters (PUT /overlay-master/agents/{id}/report): after each reconcile
// the agent computes it, and reportLoop sends it when it changed. The
// reconcile never waits on the masters.
type reporter struct {
	mu sync.Mutex
	// attempts counts the reconciles of the record version attemptsFor.
	attempts    uint32
	attemptsFor uint64
	// want is the latest result; sent the last one the masters acknowledged.
	want, sent *api.ReportRequest
	// peak is the most peers a reconcile programmed (sameResult).
	peak int
	// meshPassword and meshAccepted are the fingerprints of the mesh
	// passwords the agent sends with and accepts besides
	// (api.MeshPasswordFingerprint), carried by every result (setMesh).
	meshPassword, meshAccepted string
	wake                       chan struct{}
}

func newReporter() *reporter { return &reporter{wake: make(chan struct{}, 1)} }

// sameResult tells whether two reports say the same (attempts and request
// ids aside: a change of the count alone is not worth a Raft write). Of
// the programmed peers, only a fall is news, or a rise back towards the
// most the agent held (peak): a report of an older index is never judged
// short for what came after it (state.LeaseTable.AgentTrust), so a rise
// that every join brings is not worth a write on every agent.
func sameResult(x, y *api.ReportRequest, peak int) bool {
	if x == nil || y == nil || x.Version != y.Version || !slices.Equal(x.Overlays, y.Overlays) ||
		x.SigningKey != y.SigningKey || x.Refusing != y.Refusing || (x.ProgrammedPeers == nil) != (y.ProgrammedPeers == nil) ||
		x.MeshPassword != y.MeshPassword || x.MeshAccepted != y.MeshAccepted {
		return false
	}
	if x.ProgrammedPeers == nil {
		return true
	}
	next, was := *x.ProgrammedPeers, *y.ProgrammedPeers
	return next == was || (next > was && was >= peak)
}

// note records the result of a reconcile of the record at next.Version.
func (r *reporter) note(next api.ReportRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if next.Version != r.attemptsFor {
		r.attempts, r.attemptsFor = 0, next.Version
	}
	r.attempts++
	next.ConfigurationAttempts = r.attempts
	next.MeshPassword, next.MeshAccepted = r.meshPassword, r.meshAccepted
	same := sameResult(&next, r.want, r.peak)
	if next.ProgrammedPeers != nil {
		r.peak = max(r.peak, *next.ProgrammedPeers)
	}
	if same {
		return
	}
	r.replace(&next)
}

// setMesh records the fingerprints of the mesh passwords the agent now
// sends with and accepts besides; when they changed, the last result is
// sent again with them (the operator's check of a round of a mesh
// password change waits for it), without waiting for a reconcile.
func (r *reporter) setMesh(password, accepted string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.meshPassword == password && r.meshAccepted == accepted {
		return
	}
	r.meshPassword, r.meshAccepted = password, accepted
	if r.want == nil {
		return // the first result carries them
	}
	next := *r.want
	next.MeshPassword, next.MeshAccepted = password, accepted
	r.replace(&next)
}

// replace makes next the result to send, under a request id of its own
// (kept across its retries), and wakes reportLoop. The caller holds r.mu.
func (r *reporter) replace(next *api.ReportRequest) {
	next.RequestID = api.NewRequestID()
	r.want = next
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// configurationAttempts is the count of reconciles of the record version.
func (r *reporter) configurationAttempts(version uint64) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if version != r.attemptsFor {
		return 0
	}
	return r.attempts
}

// pending is the result to send, or nil when the masters have it.
func (r *reporter) pending() *api.ReportRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.want == nil || (r.sent != nil && r.want.RequestID == r.sent.RequestID) {
		return nil
	}
	c := *r.want
	return &c
}

func (r *reporter) acknowledged(req *api.ReportRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = req
}

// reportLoop sends the agent's configuration result to the masters when it
// changed, retrying with backoff; a newer result replaces one not yet
// sent.
func (a *Agent) reportLoop(ctx context.Context) {
	b := retry.Backoff{First: firstRetry, Max: maxRetry}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.reports.wake:
		}
		for ctx.Err() == nil {
			req := a.reports.pending()
			if req == nil {
				b.Reset()
				break
			}
			cctx, cancel := context.WithTimeout(ctx, reportTimeout)
			_, err := a.client.Report(cctx, a.id, *req)
			cancel()
			if err == nil {
				a.reports.acknowledged(req)
				a.metrics.reports.WithLabelValues("ok").Inc()
				a.log.Debug("configuration reported", "version", req.Version, "overlays", req.Overlays, "attempts", req.ConfigurationAttempts)
				continue
			}
			a.metrics.reports.WithLabelValues("error").Inc()
			a.log.Warn("report the configuration result to the masters", "version", req.Version, "err", err)
			if !retry.Sleep(ctx, b.Next()) {
				return
			}
		}
	}
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
	a.reports.note(req)
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
	info.ConfigurationAttempts = a.reports.configurationAttempts(info.Version)
	return &info
}
