package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/carve-net/carve/vxlan"
)

type metrics struct {
	reconcile        *prometheus.HistogramVec
	changes          *prometheus.CounterVec
	netlinkErrors    *prometheus.CounterVec
	peersKnown       prometheus.Gauge
	peersProgrammed  prometheus.Gauge
	registrations    *prometheus.CounterVec
	mastersReachable prometheus.Gauge
	gossip           *prometheus.CounterVec
	gossipPeers      prometheus.Gauge
	staleStates      prometheus.Counter
	rebuilds         prometheus.Counter
	httpRefused      *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		reconcile: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "carve_agent_reconcile_duration_seconds", Help: "Kernel reconciles, by mode (apply: the difference; resync: full read-back).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"mode"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_kernel_changes_total", Help: "Kernel objects added, updated or removed, by kind.",
		}, []string{"kind"}),
		netlinkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_netlink_errors_total", Help: "Failed netlink operations, by kind of object.",
		}, []string{"kind"}),
		peersKnown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_peers", Help: "Other agents in the desired dataplane.",
		}),
		peersProgrammed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_peers_programmed", Help: "Other agents whose neighbour, FDB and routes are in the kernel.",
		}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_registrations_total", Help: "Registration attempts, by result.",
		}, []string{"result"}),
		mastersReachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_masters_reachable", Help: "1 when the last state watch succeeded.",
		}),
		gossip: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_gossip_messages_total", Help: "Membership gossip received, by result (news, known, bad, other_cluster: from another cluster of masters, refused).",
		}, []string{"result"}),
		gossipPeers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_gossip_peers", Help: "Peers the mesh router knows.",
		}),
		staleStates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_stale_master_states_total", Help: "Master states ignored because they were behind what the agent had seen (same cluster, lower index).",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_cluster_rebuilds_total", Help: "Rebuilds of the masters' cluster seen (a new cluster id): the membership was reset.",
		}),
		httpRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_http_refused_total", Help: "Requests to the agent's HTTP API refused, by reason (no_certificate: no verified client certificate of the cluster CA).",
		}, []string{"reason"}),
	}
	for _, k := range vxlan.Kinds {
		m.changes.WithLabelValues(string(k))
		m.netlinkErrors.WithLabelValues(string(k))
	}
	for _, r := range []string{"ok", "error"} {
		m.registrations.WithLabelValues(r)
	}
	for _, r := range []string{"news", "known", "bad", "other_cluster"} {
		m.gossip.WithLabelValues(r)
	}
	m.httpRefused.WithLabelValues("no_certificate")
	reg.MustRegister(m.reconcile, m.changes, m.netlinkErrors, m.peersKnown, m.peersProgrammed, m.registrations,
		m.mastersReachable, m.gossip, m.gossipPeers, m.staleStates, m.rebuilds, m.httpRefused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observe records one reconcile's report.
func (m *metrics) observe(mode string, rep *vxlan.Report) {
	m.reconcile.WithLabelValues(mode).Observe(rep.Duration.Seconds())
	for k, c := range rep.ByKind() {
		if n := c.Changes(); n > 0 {
			m.changes.WithLabelValues(string(k)).Add(float64(n))
		}
		if c.Failed > 0 {
			m.netlinkErrors.WithLabelValues(string(k)).Add(float64(c.Failed))
		}
	}
}
