package master

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
)

// trustMetrics count what the masters refuse to protect the cluster from
// a compromised agent or an unauthenticated client: quotas, revoked
// certificates.
type trustMetrics struct {
	// quotaRefusals: writes refused for an agent's quota, by write (grow,
	// grant).
	quotaRefusals *prometheus.CounterVec
	// handshakeFailures: failed TLS handshakes on the API (logged at most
	// every few seconds).
	handshakeFailures prometheus.Counter
	// revokedRefusals: revoked certificates refused, by where: api (401),
	// raft and forward (the handshake).
	revokedRefusals *prometheus.CounterVec
}

// Labels of carve_master_quota_refusals_total.
const (
	quotaWriteGrow  = "grow"
	quotaWriteGrant = "grant"
)

func newTrustMetrics(reg prometheus.Registerer, conns func() (evicted, shed uint64), revokedCount func() int) *trustMetrics {
	m := &trustMetrics{
		revokedRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_revoked_refusals_total",
			Help: "Certificates on the deny list refused, by where: api (401 on a request), raft (the Raft transport's handshake, both ways), forward (a follower's connection to the leader).",
		}, []string{"where"}),
		handshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_master_tls_handshake_failures_total",
			Help: "API connections whose TLS handshake failed (another CA, an expired or revoked certificate, plain http, a client that never finished): logged at most once per 10s, counted every time.",
		}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_quota_refusals_total",
			Help: "Grows and grant reports refused (409 quota) because the agent would hold more grown and granted space than the overlay's quota_prefix, by write: grow, grant.",
		}, []string{"write"}),
	}
	for _, w := range []string{quotaWriteGrow, quotaWriteGrant} {
		m.quotaRefusals.WithLabelValues(w)
	}
	for _, w := range []string{revokedOnAPI, revokedOnRaft, revokedOnForward} {
		m.revokedRefusals.WithLabelValues(w)
	}
	revoked := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_revoked_certificates", Help: "Certificates on the deny list (carve certs revoke).",
	}, func() float64 { return float64(revokedCount()) })
	evicted := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "carve_master_unauthenticated_conns_evicted_total",
		Help: "API connections without a client certificate closed to make room for others (their share of --max-connections was full, or every slot was taken).",
	}, func() float64 { n, _ := conns(); return float64(n) })
	shed := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "carve_master_conns_turned_away_total",
		Help: "API connections reset as they came because authenticated clients held every slot of --max-connections (their clients try another master).",
	}, func() float64 { _, n := conns(); return float64(n) })
	reg.MustRegister(m.quotaRefusals, m.handshakeFailures, m.revokedRefusals, evicted, shed, revoked)
	return m
}

// refuseQuota answers a write refused for the agent's quota (409 quota;
// the message names the cap) and counts it.
func (s *server) refuseQuota(w http.ResponseWriter, r *http.Request, err error) {
	write := quotaWriteGrow
	if strings.HasSuffix(r.URL.Path, "/grants") {
		write = quotaWriteGrant
	}
	s.m.metrics.trust.quotaRefusals.WithLabelValues(write).Inc()
	httpapi.WriteError(w, http.StatusConflict, api.CodeQuota, err.Error())
}

// connCounts are the unauthenticated API connections closed to make room,
// and the connections turned away at a full cap (0 before the server
// starts).
func (m *Master) connCounts() (evicted, shed uint64) {
	if m.httpSrv == nil {
		return 0, 0
	}
	return m.httpSrv.Evicted(), m.httpSrv.Shed()
}
