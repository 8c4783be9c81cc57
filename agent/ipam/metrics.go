package ipam

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/claimkeys"
	"github.com/carve-net/carve/agent/ipam/ringgossip"
)

type metrics struct {
	ops           *prometheus.CounterVec
	commitSeconds prometheus.Histogram
	commitWrites  prometheus.Histogram
	commitErrors  prometheus.Counter
	ringGossip    *prometheus.CounterVec

	grows          *prometheus.CounterVec
	grantsGiven    prometheus.Counter
	grantsReceived prometheus.Counter
	returned       prometheus.Counter
	refused        *prometheus.CounterVec
	exhausted      prometheus.Counter
	reports        *prometheus.CounterVec
	netnsReclaims  *prometheus.CounterVec
	claimsRefused  *prometheus.CounterVec
	isolated       *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_operations_total", Help: "Container address operations, by kind.",
		}, []string{"op"}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "carve_agent_ipam_commit_duration_seconds", Help: "Group commits of the IPAM: one bbolt transaction and fsync each.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		commitWrites: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "carve_agent_ipam_commit_writes", Help: "Writes (allocations, releases, rings) per group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_commit_errors_total", Help: "Group commits that failed (their changes were taken back).",
		}),
		ringGossip: ringgossip.NewResultsCounter(),
		grows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grows_total", Help: "Attempts to grow a bridge, by path (master, ring) and result.",
		}, []string{"path", "result"}),
		grantsGiven: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grants_given_total", Help: "Blocks this agent granted to peers through the ring.",
		}),
		grantsReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grants_received_total", Help: "Blocks peers granted this agent through the ring.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_blocks_returned_total", Help: "Idle grown blocks given back (to their donor or the masters).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_grow_refused_total", Help: "Requests for space that were refused or unanswered, by reason.",
		}, []string{"reason"}),
		exhausted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_ipam_exhausted_total", Help: "Allocations that failed because no space could be found.",
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_master_reports_total", Help: "Grants and returns reported to the masters, by kind and result.",
		}, []string{"kind", "result"}),
		netnsReclaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_ipam_netns_reclaims_total", Help: "Allocations of containers whose network namespace was gone for --reclaim-after, by result (released; dry_run: reported by --reclaim-dry-run, not released).",
		}, []string{"result"}),
	}
	m.claimsRefused = claimkeys.NewRefusedCounter()
	m.isolated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_agent_ipam_isolated_addresses",
		Help: "Addresses of this agent's containers in space the masters' records took from it (a restore, a lease moved): the containers keep them, the agent hands out nothing there, and the rest of the overlay is served; carve ipam check names them.",
	}, []string{"overlay"})
	for _, op := range []string{"allocate", "release", "gc_release", "reclaim"} {
		m.ops.WithLabelValues(op)
	}
	for _, r := range []string{"released", "dry_run"} {
		m.netnsReclaims.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.ops, m.commitSeconds, m.commitWrites, m.commitErrors, m.ringGossip,
		m.grows, m.grantsGiven, m.grantsReceived, m.returned, m.refused, m.exhausted, m.reports, m.netnsReclaims, m.claimsRefused, m.isolated} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ipam: register metrics: %w", err)
		}
	}
	return m, nil
}
