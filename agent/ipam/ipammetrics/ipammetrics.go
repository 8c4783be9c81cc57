// Package ipammetrics is the IPAM's Prometheus metrics: its operations, its
// group commits, growth (grows, grants, returns, refusals, exhaustion), the
// reports to the masters, the reclaims, the refused claims and the isolated
// addresses, each registered once; the IPAM counts, this package only names
// and registers. The ring gossip's and the claim keys' counters are made by
// their packages (ringgossip, claimkeys).
package ipammetrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/claimkeys"
	"github.com/carve-net/carve/agent/ipam/ringgossip"
)

// Metrics are the IPAM's collectors.
type Metrics struct {
	Ops           *prometheus.CounterVec
	CommitSeconds prometheus.Histogram
	CommitWrites  prometheus.Histogram
	CommitErrors  prometheus.Counter
	RingGossip    *prometheus.CounterVec

	Grows          *prometheus.CounterVec
	GrantsGiven    prometheus.Counter
	GrantsReceived prometheus.Counter
	Returned       prometheus.Counter
	Refused        *prometheus.CounterVec
	Exhausted      prometheus.Counter
	Reports        *prometheus.CounterVec
	NetnsReclaims  *prometheus.CounterVec
	ClaimsRefused  *prometheus.CounterVec
	Isolated       *prometheus.GaugeVec
}

// New makes the collectors and registers them with reg (nil: none).
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_operations_total", Help: "Container address operations, by kind.",
		}, []string{"op"}),
		CommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "carve_agent_ipam_commit_duration_seconds", Help: "Group commits of the IPAM: one bbolt transaction and fsync each.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		CommitWrites: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "carve_agent_ipam_commit_writes", Help: "Writes (allocations, releases, rings) per group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		CommitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_commit_errors_total", Help: "Group commits that failed (their changes were taken back).",
		}),
		RingGossip: ringgossip.NewResultsCounter(),
		Grows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grows_total", Help: "Attempts to grow a bridge, by path (master, ring) and result.",
		}, []string{"path", "result"}),
		GrantsGiven: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grants_given_total", Help: "Blocks this agent granted to peers through the ring.",
		}),
		GrantsReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grants_received_total", Help: "Blocks peers granted this agent through the ring.",
		}),
		Returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_blocks_returned_total", Help: "Idle grown blocks given back (to their donor or the masters).",
		}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grow_refused_total", Help: "Requests for space that were refused or unanswered, by reason.",
		}, []string{"reason"}),
		Exhausted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_exhausted_total", Help: "Allocations that failed because no space could be found.",
		}),
		Reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_master_reports_total", Help: "Grants and returns reported to the masters, by kind and result.",
		}, []string{"kind", "result"}),
		NetnsReclaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_netns_reclaims_total", Help: "Allocations of containers whose network namespace was gone for --reclaim-after, by result (released; dry_run: reported by --reclaim-dry-run, not released).",
		}, []string{"result"}),
	}
	m.ClaimsRefused = claimkeys.NewRefusedCounter()
	m.Isolated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_agent_ipam_isolated_addresses",
		Help: "Addresses of this agent's containers in space the masters' records took from it (a restore, a lease moved): the containers keep them, the agent hands out nothing there, and the rest of the overlay is served; carve ipam check names them.",
	}, []string{"overlay"})
	for _, op := range []string{"allocate", "release", "gc_release", "reclaim"} {
		m.Ops.WithLabelValues(op)
	}
	for _, r := range []string{"released", "dry_run"} {
		m.NetnsReclaims.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.Ops, m.CommitSeconds, m.CommitWrites, m.CommitErrors, m.RingGossip,
		m.Grows, m.GrantsGiven, m.GrantsReceived, m.Returned, m.Refused, m.Exhausted, m.Reports, m.NetnsReclaims, m.ClaimsRefused, m.Isolated} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ipam: register metrics: %w", err)
		}
	}
	return m, nil
}
