package raftlog

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons used as the "reason" label of carve_raft_apply_errors_total.
const (
	reasonNotLeader      = "not_leader"
	reasonLeadershipLost = "leadership_lost"
	reasonUnknownOutcome = "unknown_outcome" // ctx ended or Close while in flight
	reasonNotSubmitted   = "not_submitted"   // ctx ended before raft took it
	reasonClosed         = "closed"
	reasonOther          = "other"
)

// nodeMetrics holds a node's Prometheus collectors. They always exist so the
// code paths need no nil checks; they are registered only when the Config
// carries a Registerer, and unregistered on Close so that a node can be
// reopened in the same process.
type nodeMetrics struct {
	reg        prometheus.Registerer
	registered []prometheus.Collector

	applyLatency  prometheus.Histogram
	applyErrors   *prometheus.CounterVec
	leaderChanges prometheus.Counter
	// tlsFailures counts transport connections refused in the TLS
	// handshake (a peer of another CA or role, or no certificate).
	tlsFailures *prometheus.CounterVec
	// historyRefused counts transport connections refused because the
	// peer is of another history (history.go).
	historyRefused *prometheus.CounterVec
}

func newNodeMetrics(reg prometheus.Registerer) *nodeMetrics {
	m := &nodeMetrics{
		reg: reg,
		applyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "carve_raft_apply_duration_seconds",
			Help:    "Time from Node.Apply being called to its successful result (commit and FSM apply).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		applyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_raft_apply_errors_total",
			Help: "Failed Node.Apply calls by reason.",
		}, []string{"reason"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_raft_leader_changes_total",
			Help: "Number of times this node observed a new leader.",
		}),
		tlsFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_raft_tls_handshake_failures_total",
			Help: "Raft transport connections whose TLS handshake failed (untrusted or unauthorized peer), by direction (incoming, outgoing).",
		}, []string{"direction"}),
		historyRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_raft_history_refused_total",
			Help: "Raft transport connections refused because the peer's log is of another history (a master on a data directory from before a whole-cluster restore), by direction (incoming, outgoing).",
		}, []string{"direction"}),
	}
	for _, d := range []string{directionIncoming, directionOutgoing} {
		m.tlsFailures.WithLabelValues(d)
		m.historyRefused.WithLabelValues(d)
	}
	for _, r := range []string{reasonNotLeader, reasonLeadershipLost, reasonUnknownOutcome, reasonNotSubmitted, reasonClosed, reasonOther} {
		m.applyErrors.WithLabelValues(r)
	}
	return m
}

// register registers the static collectors and gauges that read the node's
// live state at scrape time.
func (m *nodeMetrics) register(n *Node) error {
	if m.reg == nil {
		return nil
	}
	cs := []prometheus.Collector{
		m.applyLatency, m.applyErrors, m.leaderChanges, m.tlsFailures, m.historyRefused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_state",
			Help: "Raft role of this node: 0 follower, 1 candidate, 2 leader, 3 shutdown.",
		}, func() float64 { return float64(n.raft.State()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_is_leader",
			Help: "1 if this node is the Raft leader, else 0.",
		}, func() float64 {
			if n.raft.State() == raft.Leader {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_caught_up",
			Help: "1 once this node has applied what the cluster had committed when it first heard from a leader after starting, else 0.",
		}, func() float64 {
			if n.IsCaughtUp() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_applied_index",
			Help: "Index of the last log entry applied to the state machine.",
		}, func() float64 { return float64(n.fsm.applied.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_commit_index",
			Help: "Highest log index known to be committed.",
		}, func() float64 { return float64(n.raft.CommitIndex()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_last_log_index",
			Help: "Index of the last entry in the local log or snapshot.",
		}, func() float64 { return float64(n.raft.LastIndex()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "carve_raft_term",
			Help: "Current Raft term.",
		}, func() float64 { return float64(n.raft.CurrentTerm()) }),
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("raftlog: metrics already registered (one node per Registerer): %w", err)
			}
			return fmt.Errorf("raftlog: register metrics: %w", err)
		}
		m.registered = append(m.registered, c)
	}
	return nil
}

func (m *nodeMetrics) unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}

func (m *nodeMetrics) applyError(reason string) {
	m.applyErrors.WithLabelValues(reason).Inc()
}
