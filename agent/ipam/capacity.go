package ipam

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Capacity. Every scrape reads, per overlay this agent serves, the
// addresses its bridges hold and have left (carve_agent_ipam_addresses),
// and the IPv4 free fraction (carve_agent_ipam_free_ratio). An overlay
// whose free fraction here is under lowFreeRatio while growth cannot help
// (the last growth found space neither at the masters nor at any peer) is
// exhausted for this agent: carve_agent_ipam_overlay_full says so, and a
// WARN is logged when it starts, then every lowSpaceRepeat.

// lowFreeRatio is the IPv4 free fraction under which an overlay that
// cannot grow is reported as running out.
const lowFreeRatio = 0.1

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

// capacityCollector exports the capacity gauges of a Service.
type capacityCollector struct{ s *Service }

func (c capacityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAddresses
	ch <- descFreeRatio
	ch <- descFull
}

func (c capacityCollector) Collect(ch chan<- prometheus.Metric) {
	for _, oc := range c.s.capacity() {
		for fam := range families {
			if !oc.has[fam] {
				continue
			}
			ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(oc.used[fam]), oc.name, familyName(fam), "used")
			ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(oc.free[fam]), oc.name, familyName(fam), "free")
		}
		if oc.has[0] {
			ch <- prometheus.MustNewConstMetric(descFreeRatio, prometheus.GaugeValue, oc.ratio(), oc.name)
			full := 0.0
			if oc.full {
				full = 1
			}
			ch <- prometheus.MustNewConstMetric(descFull, prometheus.GaugeValue, full, oc.name)
		}
	}
}

// overlayCapacity is one overlay's use on this agent.
type overlayCapacity struct {
	name       string
	has        [families]bool
	used, free [families]uint64
	// full: the free fraction is low and growth cannot help.
	full bool
}

// ratio is the IPv4 free fraction (1 for a bridge with no address at all).
func (oc overlayCapacity) ratio() float64 {
	total := float64(oc.used[0]) + float64(oc.free[0])
	if total == 0 {
		return 1
	}
	return float64(oc.free[0]) / total
}

// capacity reads every served overlay's use.
func (s *Service) capacity() []overlayCapacity {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []overlayCapacity
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		if o.unserved != "" {
			continue
		}
		oc := overlayCapacity{name: name}
		for fam := range families {
			if o.alloc[fam] == nil {
				continue
			}
			for kind := range o.bridges {
				if len(o.bridgeBlocks(kind, fam)) > 0 {
					oc.has[fam] = true
					oc.free[fam] = satAdd(oc.free[fam], o.freeHosts(kind, fam))
				}
			}
			for _, rec := range o.attached {
				if rec.addr(fam).IsValid() {
					oc.used[fam]++
				}
			}
		}
		oc.full = oc.has[0] && oc.ratio() < lowFreeRatio && !s.grow.fullSince[name].IsZero()
		out = append(out, oc)
	}
	return out
}

// warnLowSpace logs, at WARN, the overlays that are running out on this
// agent with no growth possible: when it starts, then every lowSpaceRepeat.
func (s *Service) warnLowSpace(now time.Time) {
	for _, oc := range s.capacity() {
		s.mu.Lock()
		last, warned := s.grow.lowWarned[oc.name]
		switch {
		case !oc.full:
			delete(s.grow.lowWarned, oc.name)
			s.mu.Unlock()
			continue
		case warned && now.Sub(last) < lowSpaceRepeat:
			s.mu.Unlock()
			continue
		}
		s.grow.lowWarned[oc.name] = now
		s.mu.Unlock()
		s.log.Warn("overlay running out of addresses on this agent and no master or peer has space to grow: new containers will fail once it is full (free the addresses of gone containers, or add an overlay with a new subnet: carve config apply)",
			"overlay", oc.name, "used", oc.used[0], "free", oc.free[0], "free_ratio", oc.ratio())
	}
}

// noteGrowth remembers whether growth can help an overlay's IPv4: a
// growth that found space nowhere marks it, a successful one clears it.
// The caller holds s.mu.
func (s *Service) noteGrowth(k growKey, err error, now time.Time) {
	switch {
	case k.fam != 0:
	case err == nil:
		delete(s.grow.fullSince, k.overlay)
	case errors.Is(err, errOverlayFull) && s.grow.fullSince[k.overlay].IsZero():
		s.grow.fullSince[k.overlay] = now
	}
}
