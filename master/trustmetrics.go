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
}

// Labels of carve_master_quota_refusals_total.
const (
	quotaWriteGrow  = "grow"
	quotaWriteGrant = "grant"
)

func newTrustMetrics(reg prometheus.Registerer) *trustMetrics {
	m := &trustMetrics{
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_master_quota_refusals_total",
			Help: "Grows and grant reports refused (409 quota) because the agent would hold more grown and granted space than the overlay's quota_prefix, by write: grow, grant.",
		}, []string{"write"}),
	}
	for _, w := range []string{quotaWriteGrow, quotaWriteGrant} {
		m.quotaRefusals.WithLabelValues(w)
	}
	reg.MustRegister(m.quotaRefusals)
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
