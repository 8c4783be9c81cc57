package ipam

import (
	"strings"
	"time"

	"github.com/carve-net/carve/agent/ipam/cnihost"
	"github.com/carve-net/carve/agent/ipam/reclaimwatch"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// Reclaim of the addresses of containers that are gone. No runtime calls
// CNI GC, so an address whose DEL never came (a runtime that crashed, a
// node that rebooted, a container killed with its namespace) stays held.
// The agent releases a CNI allocation whose network namespace, recorded in
// its owner (CNI_NETNS), has been missing for ReclaimConfig.After: only for
// a path under a runtime directory it knows (ReclaimConfig.NetNSDirs) that
// itself exists, never for an allocation without a netns path (Docker's:
// its plugin collects them against the engine), and never while the path
// exists.
//
// It is the other half of the CNI-cache reclaim (reclaim.go): that one
// takes back, after a lost data dir, the addresses live containers still
// hold, and records their owner and netns from the cache; this one lets go
// of those whose namespace is gone. Both decide from what the runtime left
// on the host (read by package cnihost), never from a guess.

// reclaimState is what the reclaim remembers between scans, under s.mu.
type reclaimState struct {
	cfg     ReclaimConfig
	missing *reclaimwatch.Missing
}

func newReclaimState(cfg ReclaimConfig) reclaimState {
	cfg.NetNSDirs = cnihost.NetNSDirs(cfg.NetNSDirs)
	return reclaimState{cfg: cfg, missing: reclaimwatch.NewMissing(cfg.After)}
}

// reclaimCandidate is an allocation whose namespace the scan checks.
type reclaimCandidate struct {
	overlay string
	at      ring.Attachment
	netns   string
}

// reclaimGone is one scan: it checks the namespace of every CNI allocation
// under a watched directory, and releases (or, in dry run, reports) those
// missing for ReclaimConfig.After. It returns what it released or would
// release.
func (s *Service) reclaimGone(now time.Time) []api.Allocation {
	if s.reclaim.cfg.After <= 0 {
		return nil
	}
	s.mu.Lock()
	var cands []reclaimCandidate
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		for _, at := range sortedAttachments(o.Attached) {
			if rec := o.Attached[at]; rec.Owner != nil && cnihost.Watched(s.reclaim.cfg.NetNSDirs, rec.Owner.NetNS) {
				cands = append(cands, reclaimCandidate{overlay: name, at: at, netns: rec.Owner.NetNS})
			}
		}
	}
	s.mu.Unlock()
	gone := map[string]bool{}
	for _, c := range cands {
		if cnihost.NetNSGone(c.netns) {
			gone[allocKey(c.overlay, c.at)] = true
		}
	}
	out, released, b := s.decideReclaim(cands, gone, now)
	if b != nil {
		if err := s.commits.Flush(b); err != nil {
			s.log.Error("release the allocations of gone containers", "err", err)
			return nil
		}
		s.metrics.NetnsReclaims.WithLabelValues("released").Add(float64(released))
	}
	return out
}

// decideReclaim updates what is missing since when and releases what is
// due, under s.mu, checking again that each allocation still has the
// namespace that was seen missing.
func (s *Service) decideReclaim(cands []reclaimCandidate, gone map[string]bool, now time.Time) ([]api.Allocation, int, *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.reclaim
	r.missing.Begin()
	var out []api.Allocation
	var b *batch
	released := 0
	for _, c := range cands {
		key := allocKey(c.overlay, c.at)
		since, due := r.missing.Due(key, c.netns, gone[key], now)
		if !due {
			continue
		}
		o := s.overlays[c.overlay]
		rec, ok := o.Attached[c.at]
		if !ok || rec.Owner == nil || rec.Owner.NetNS != c.netns || s.commits.Pending(key) {
			continue
		}
		al := *s.render(o, c.at, rec)
		if r.cfg.DryRun {
			if r.missing.FirstReport(key) {
				s.metrics.NetnsReclaims.WithLabelValues("dry_run").Inc()
				s.log.Warn("dry run: would release the addresses of a container whose network namespace is gone",
					"overlay", c.overlay, "addresses", ipList(al), "owner", rec.Owner.String(), "netns", c.netns, "missing_since", since)
			}
			out = append(out, al)
			continue
		}
		s.log.Warn("released the addresses of a container whose network namespace is gone (no DEL came)",
			"overlay", c.overlay, "addresses", ipList(al), "owner", rec.Owner.String(), "netns", c.netns, "missing_since", since)
		b = s.release(o, c.at)
		released++
		r.missing.Released(key)
		out = append(out, al)
	}
	r.missing.End()
	return out, released, b
}

// ipList is an allocation's addresses for a log line.
func ipList(al api.Allocation) string {
	var out []string
	for _, ip := range al.IPs {
		out = append(out, ip.Address)
	}
	return strings.Join(out, ",")
}

// reclaimScans is how many scans reclaimGone made.
func (s *Service) reclaimScans() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reclaim.missing.Scans()
}
