package master

import (
	"github.com/prometheus/client_golang/prometheus"
	"strconv"

	"github.com/carve-net/carve/master/changestream"
	"github.com/carve-net/carve/master/state"
)

type metrics struct {
	registrations *prometheus.CounterVec
	reports       *prometheus.CounterVec
	allocFailures *prometheus.CounterVec
	httpRequests  *prometheus.CounterVec
	forwarded     prometheus.Counter
	authRefusals  *prometheus.CounterVec
	grown         prometheus.Counter
	returned      prometheus.Counter
	grantsLearned prometheus.Counter
	growRefused   *prometheus.CounterVec
	released      prometheus.Counter
	trust         *trustMetrics
	// streams: changes streams open; streamEnds: those that ended, by
	// why (a write_failed is a client that stopped reading, or a broken
	// connection: the one end the agent is not told of).
	streams    prometheus.Gauge
	streamEnds *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, t *state.LeaseTable, conns func() (evicted, shed uint64)) *metrics {
	m := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_registrations_total", Help: "Agent registrations answered by this master, by result.",
		}, []string{"result"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_agent_reports_total",
			Help: "Agents' configuration reports answered by this master, by result (ok: committed, unchanged: no log entry needed).",
		}, []string{"result"}),
		allocFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_allocation_failures_total", Help: "Leases that could not be allocated, by reason.",
		}, []string{"reason"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_http_requests_total", Help: "HTTP requests, by method, route and status code.",
		}, []string{"method", "route", "code"}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_master_forwarded_requests_total", Help: "Requests this follower proxied to the leader.",
		}),
		authRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_auth_refusals_total",
			Help: "API requests refused by authentication (401) or authorization (403), by reason: no_certificate, forbidden_role, wrong_agent, wrong_ip, wrong_mesh_addr, wireguard_proof, revoked, grant_unsigned, grant_bad_signature, grant_expired (a recipient's grant report without its donor's valid signed word).",
		}, []string{"reason"}),
	}
	m.trust = newTrustMetrics(reg, conns, func() int { return len(t.Revoked()) })
	m.grown = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_blocks_grown_total", Help: "Blocks leased to agents that asked to grow (answered by this master as leader).",
	})
	m.returned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_blocks_returned_total", Help: "Block returns committed (answered by this master as leader).",
	})
	m.grantsLearned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_grants_learned_total", Help: "Ring grant reports committed (answered by this master as leader), repeats included.",
	})
	m.growRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_master_grow_refused_total", Help: "Grow requests refused, by reason: exhausted, invalid, unknown_agent, quota, other.",
	}, []string{"reason"})
	m.released = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "carve_master_quarantine_released_total", Help: "Quarantined blocks of deleted agents freed by releases this master proposed.",
	})
	for _, r := range []string{growRefusedExhausted, growRefusedInvalid, growRefusedUnknown, growRefusedQuota, growRefusedOther} {
		m.growRefused.WithLabelValues(r)
	}
	quarantined := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_quarantined_blocks", Help: "Blocks of deleted agents' space not yet leasable again (quarantine).",
	}, func() float64 { return float64(t.QuarantinedCount()) })
	reg.MustRegister(m.grown, m.returned, m.grantsLearned, m.growRefused, m.released, quarantined)
	// Export zeros for the known labels, so dashboards and alerts see the series.
	for _, r := range []string{"ok", "unchanged", "error", "bad_request"} {
		m.registrations.WithLabelValues(r)
		m.reports.WithLabelValues(r)
	}
	for _, r := range []string{"vtep_exhausted", "overlay_subnet_exhausted"} {
		m.allocFailures.WithLabelValues(r)
	}
	for _, r := range append([]string{refusedNoCertificate, refusedRole, refusedWrongAgent, refusedWrongIP, refusedWrongMeshAddr, refusedWireGuardProof, refusedRevoked}, grantRefusalReasons...) {
		m.authRefusals.WithLabelValues(r)
	}
	m.streams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "carve_master_change_streams", Help: "Changes streams (GET /overlay-master/changes/stream) this master serves now.",
	})
	m.streamEnds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_master_change_stream_ends_total", Help: "Changes streams ended, by reason: client, write_failed, gone, revoked, stop, failed.",
	}, []string{"reason"})
	for _, r := range changestream.EndLabels() {
		m.streamEnds.WithLabelValues(r)
	}
	reg.MustRegister(m.streams, m.streamEnds)
	agents := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_agents", Help: "Agents in the lease table.",
	}, func() float64 { return float64(t.AgentCount()) })
	stateIndex := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_state_index", Help: "Raft index of the last change of the lease table.",
	}, func() float64 { return float64(t.Index()) })
	reg.MustRegister(m.registrations, m.reports, m.allocFailures, m.httpRequests, m.forwarded, m.authRefusals, agents, stateIndex,
		stateDigestCollector{t})
	return m
}

// stateDigestDesc is carve_master_state_digest: the latest digest of the
// replicated state, as labels. Masters whose series share an index label
// but not a digest label hold different states at the same Raft index
// (the CarveMastersDiverged alert).
var stateDigestDesc = prometheus.NewDesc("carve_master_state_digest",
	"The latest digest of this master's replicated state (always 1): index is the Raft index it was taken at, digest its SHA-256. Masters with the same index and another digest have diverged.",
	[]string{"index", "digest"}, nil)

// stateDigestCollector exports the table's latest state digest.
type stateDigestCollector struct{ t *state.LeaseTable }

func (stateDigestCollector) Describe(ch chan<- *prometheus.Desc) { ch <- stateDigestDesc }

func (c stateDigestCollector) Collect(ch chan<- prometheus.Metric) {
	ds := c.t.StateDigests()
	if len(ds) == 0 {
		return
	}
	d := ds[len(ds)-1]
	ch <- prometheus.MustNewConstMetric(stateDigestDesc, prometheus.GaugeValue, 1, strconv.FormatUint(d.Index, 10), d.Digest)
}
