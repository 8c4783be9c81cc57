package master

import (
	"crypto/ed25519"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/pki"
)

// Agent liveness (state/liveness.go): every request of an agent is noted,
// and the leader judges which agents are silent.

// noteHeard notes the agent a request comes from (a mux middleware, after
// authentication): the agent of its certificate, or without TLS the agent
// of the path of its own writes (report, usage, blocks).
func (s *server) noteHeard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := requestIdentity(r); ok {
			if id.Role == pki.RoleAgent {
				s.m.table.Heard(id.Name, time.Now())
			}
		} else if agent := mux.Vars(r)["id"]; agent != "" && r.Method != http.MethodGet && r.Method != http.MethodDelete &&
			strings.HasPrefix(r.URL.Path, "/overlay-master/agents/") {
			s.m.table.Heard(agent, time.Now())
		}
		next.ServeHTTP(w, r)
	})
}

// judgeLiveness, run by the leader's duties, marks the agents silent for
// longer than Options.AgentSilentAfter (counted from when this master
// started leading: it heard nothing before) and forgets the judgement when
// this master no longer leads; leadingSince is when it started leading
// (zero: it does not lead).
func (m *Master) judgeLiveness(leadingSince *time.Time) {
	if !m.node.IsLeader() {
		if !leadingSince.IsZero() {
			*leadingSince = time.Time{}
			m.table.StopJudging()
		}
		return
	}
	now := time.Now()
	if leadingSince.IsZero() {
		*leadingSince = now
	}
	for _, id := range m.table.JudgeSilence(now, m.opts.AgentSilentAfter, *leadingSince) {
		m.log.Warn("agent silent: not heard from (no watch, report or usage report); its overlays show STATUS_FAILED until it is heard again",
			"agent", id, "silent_after", m.opts.AgentSilentAfter)
	}
}

// silentAgentsGauge is carve_master_silent_agents.
func (m *Master) silentAgentsGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "carve_master_silent_agents",
		Help: "Agents not heard from for longer than the silence threshold, as the leader judges (0 on followers).",
	}, func() float64 { return float64(len(m.table.SilentAgents())) })
}

// fillAgentTrust sets the key this master signs with and, on the leader
// (which judges silence), what the live agents report of the masters'
// records (state.LeaseTable.AgentTrust).
func (m *Master) fillAgentTrust(out *api.ClusterStatus, leader bool) {
	if k := m.signingKey.Load(); k != nil && *k != nil {
		out.SigningKey = api.EncodeSigningKey((*k).Public().(ed25519.PublicKey))
	}
	if !leader {
		return
	}
	silent := map[string]bool{}
	for _, s := range out.SilentAgents {
		silent[s.AgentID] = true
	}
	if tr := m.table.AgentTrust(out.SigningKey, silent); tr.OtherKeyCount+tr.RefusingCount+tr.FewPeersCount > 0 {
		out.AgentTrust = &tr
	}
}
