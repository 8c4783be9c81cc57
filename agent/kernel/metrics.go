package kernel

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/vxlan"
)

// metrics are the reconciles' metrics, registered on the agent's registry.
type metrics struct {
	reconcile       *prometheus.HistogramVec
	changes         *prometheus.CounterVec
	netlinkErrors   *prometheus.CounterVec
	peersKnown      prometheus.Gauge
	peersProgrammed prometheus.Gauge
	// peersByMode counts the peers of the last reconcile by dataplane
	// mode (vxlan.Modes).
	peersByMode *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, dp *vxlan.Dataplane) *metrics {
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
		peersByMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_agent_peers_by_mode", Help: "Other agents in the last reconcile, by how the dataplane reaches them: vxlan (through the VTEP) or routed (via their underlay IP, no encapsulation); peers reached through WireGuard are in carve_wireguard_peers.",
		}, []string{"mode"}),
		peersProgrammed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_peers_programmed", Help: "Other agents whose neighbour, FDB and routes are in the kernel.",
		}),
	}
	for _, k := range vxlan.Kinds {
		m.changes.WithLabelValues(string(k))
		m.netlinkErrors.WithLabelValues(string(k))
	}
	for _, mode := range vxlan.Modes {
		m.peersByMode.WithLabelValues(string(mode))
	}
	if reg != nil {
		reg.MustRegister(m.reconcile, m.changes, m.netlinkErrors, m.peersKnown, m.peersProgrammed, m.peersByMode)
		if dp != nil {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "carve_agent_fastpath_packets_total",
				Help: "Packets between routed peers' containers and this host's that the eBPF fast path forwarded past the host's stack (since the agent started).",
			}, func() float64 { all, _ := dp.FastPathPackets(); return float64(all) }))
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "carve_agent_fastpath_container_packets_total",
				Help: "Of carve_agent_fastpath_packets_total, those sent straight into a container's network namespace, past its bridge.",
			}, func() float64 { _, into := dp.FastPathPackets(); return float64(into) }))
		}
	}
	return m
}

// observe records one reconcile's report.
func (m *metrics) observe(mode string, rep *vxlan.Report) {
	m.reconcile.WithLabelValues(mode).Observe(rep.Duration.Seconds())
	if rep.Modes != nil { // nil: the reconcile stopped before the peers
		for k, n := range rep.PeersByMode() {
			m.peersByMode.WithLabelValues(string(k)).Set(float64(n))
		}
	}
	for k, c := range rep.ByKind() {
		if n := c.Changes(); n > 0 {
			m.changes.WithLabelValues(string(k)).Add(float64(n))
		}
		if c.Failed > 0 {
			m.netlinkErrors.WithLabelValues(string(k)).Add(float64(c.Failed))
		}
	}
}

// programmed sets the peer counts of a reconcile that reached the kernel:
// programmed of the known ones.
func (m *metrics) programmed(programmed, known int) {
	m.peersProgrammed.Set(float64(programmed))
	m.peersKnown.Set(float64(known))
}
