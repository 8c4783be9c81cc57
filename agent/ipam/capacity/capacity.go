// Package capacity is what an agent's IPAM tells of its overlays' room:
// every scrape reads, per overlay it serves, the addresses its bridges
// hold and have left (carve_agent_ipam_addresses) and the IPv4 free
// fraction (carve_agent_ipam_free_ratio). An overlay whose free fraction
// here is under LowFreeRatio while growth cannot help (the last growth
// found space neither at the masters nor at any peer) is exhausted for
// this agent: carve_agent_ipam_overlay_full says so, and a WARN is logged
// when it starts, then every lowSpaceRepeat. It remembers which overlays'
// growth found space nowhere; the counts it reads from its owner (Read).
//
// Its exported surface is this file.
package capacity

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LowFreeRatio is the IPv4 free fraction under which an overlay that
// cannot grow is reported as running out.
const LowFreeRatio = 0.1

// lowSpaceRepeat is how often the WARN of an overlay running out repeats.
const lowSpaceRepeat = 10 * time.Minute

var (
	descAddresses = prometheus.NewDesc("carve_agent_ipam_addresses",
		"Container addresses of an overlay's bridges on this agent, by family and state (used: held by containers; free: left to hand out, bridge addresses excluded; IPv6 free saturates at 2^64-1).",
		[]string{"overlay", "family", "state"}, nil)
	descFreeRatio = prometheus.NewDesc("carve_agent_ipam_free_ratio",
		"IPv4 free / (used + free) of an overlay's bridges on this agent, before growth.",
		[]string{"overlay"}, nil)
	descFull = prometheus.NewDesc("carve_agent_ipam_overlay_full",
		"1 when an overlay's IPv4 free fraction on this agent is under 0.1 and growth cannot help (no master or peer had space on the last try).",
		[]string{"overlay"}, nil)
)

// Overlay is one served overlay's use on this agent, by family index.
type Overlay struct {
	Name       string
	Has        [2]bool
	Used, Free [2]uint64
	// Full: the free fraction is low and growth cannot help (set by
	// Tracker.Read).
	Full bool
}

// Ratio is the IPv4 free fraction (1 for a bridge with no address at all).
func (oc Overlay) Ratio() float64 {
	total := float64(oc.Used[0]) + float64(oc.Free[0])
	if total == 0 {
		return 1
	}
	return float64(oc.Free[0]) / total
}

// Tracker remembers which overlays cannot grow, and is the Prometheus
// collector of the capacity gauges.
type Tracker struct {
	read func() []Overlay
	log  *slog.Logger

	mu sync.Mutex
	// fullSince: overlays whose last IPv4 growth found space nowhere, and
	// lowWarned when their low space was last logged.
	fullSince map[string]time.Time
	lowWarned map[string]time.Time
}

// New returns a tracker that reads the served overlays' counts with read
// (called without the tracker's lock held).
func New(read func() []Overlay, log *slog.Logger) *Tracker {
	return &Tracker{read: read, log: log, fullSince: map[string]time.Time{}, lowWarned: map[string]time.Time{}}
}

// Read returns every served overlay's use, each marked Full when its free
// fraction is low and its last IPv4 growth found space nowhere.
func (t *Tracker) Read() []Overlay {
	out := t.read()
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range out {
		oc := &out[i]
		oc.Full = oc.Has[0] && oc.Ratio() < LowFreeRatio && !t.fullSince[oc.Name].IsZero()
	}
	return out
}

// NoteGrowth remembers whether growth can help an overlay's IPv4: a
// growth that found space nowhere (nowhere) marks it, a successful one
// (ok) clears it.
func (t *Tracker) NoteGrowth(overlay string, ok, nowhere bool, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case ok:
		delete(t.fullSince, overlay)
	case nowhere && t.fullSince[overlay].IsZero():
		t.fullSince[overlay] = now
	}
}

// WarnLowSpace logs, at WARN, the overlays that are running out on this
// agent with no growth possible: when it starts, then every lowSpaceRepeat.
func (t *Tracker) WarnLowSpace(now time.Time) {
	for _, oc := range t.Read() {
		t.mu.Lock()
		last, warned := t.lowWarned[oc.Name]
		switch {
		case !oc.Full:
			delete(t.lowWarned, oc.Name)
			t.mu.Unlock()
			continue
		case warned && now.Sub(last) < lowSpaceRepeat:
			t.mu.Unlock()
			continue
		}
		t.lowWarned[oc.Name] = now
		t.mu.Unlock()
		t.log.Warn("overlay running out of addresses on this agent and no master or peer has space to grow: new containers will fail once it is full (free the addresses of gone containers, or add an overlay with a new subnet: carve config apply)",
			"overlay", oc.Name, "used", oc.Used[0], "free", oc.Free[0], "free_ratio", oc.Ratio())
	}
}

// Describe implements prometheus.Collector.
func (t *Tracker) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAddresses
	ch <- descFreeRatio
	ch <- descFull
}

// Collect implements prometheus.Collector.
func (t *Tracker) Collect(ch chan<- prometheus.Metric) {
	for _, oc := range t.Read() {
		for fam, name := range [2]string{"4", "6"} {
			if !oc.Has[fam] {
				continue
			}
			ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(oc.Used[fam]), oc.Name, name, "used")
			ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(oc.Free[fam]), oc.Name, name, "free")
		}
		if oc.Has[0] {
			ch <- prometheus.MustNewConstMetric(descFreeRatio, prometheus.GaugeValue, oc.Ratio(), oc.Name)
			full := 0.0
			if oc.Full {
				full = 1
			}
			ch <- prometheus.MustNewConstMetric(descFull, prometheus.GaugeValue, full, oc.Name)
		}
	}
}
