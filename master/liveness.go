package master

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
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
				now := time.Now()
				s.m.table.Heard(id.Name, now)
				if ca, notBefore, ok := presentedCA(r); ok {
					s.m.table.NoteCA(id.Name, ca, notBefore, now)
				}
			}
		} else if agent := mux.Vars(r)["id"]; agent != "" && r.Method != http.MethodGet && r.Method != http.MethodDelete &&
			strings.HasPrefix(r.URL.Path, "/overlay-master/agents/") {
			s.m.table.Heard(agent, time.Now())
		}
		next.ServeHTTP(w, r)
	})
}

// presentedCAHeader carries, on a request a follower forwards to the
// leader, the certificate the agent that sent it presented to the
// follower: the fingerprint of its issuing CA and its NotBefore in Unix
// seconds, "CA NOTBEFORE" (presentedCAValue). The leader, which judges
// which agents are live, learns so which CA every live agent's
// certificate comes from, also of the agents that talk to followers
// only; it believes the header only on a master's connection.
const presentedCAHeader = "X-Carve-Client-CA"

// presentedCA is the CA (api.CAFingerprint) that issued the agent
// certificate a request comes with, and that certificate's NotBefore:
// the request's own connection's, or on a master's connection (a
// forwarded request) presentedCAHeader's. false: none known (no TLS, a
// master's own request, a header that does not parse).
func presentedCA(r *http.Request) (string, time.Time, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", time.Time{}, false
	}
	chain := r.TLS.VerifiedChains[0]
	if leaf := directAgentCertificate(r); leaf != nil {
		if len(chain) < 2 {
			return "", time.Time{}, false
		}
		return api.CAFingerprint(chain[1].RawSubjectPublicKeyInfo), leaf.NotBefore, true
	}
	if id, err := pki.IdentityOf(chain[0]); err != nil || id.Role != pki.RoleMaster {
		return "", time.Time{}, false
	}
	return parsePresentedCA(r.Header.Get(presentedCAHeader))
}

// presentedCAValue is presentedCAHeader's value for a request that came
// with an agent certificate on its own connection, "" otherwise.
func presentedCAValue(r *http.Request) string {
	if directAgentCertificate(r) == nil {
		return ""
	}
	ca, notBefore, ok := presentedCA(r)
	if !ok {
		return ""
	}
	return ca + " " + strconv.FormatInt(notBefore.Unix(), 10)
}

// parsePresentedCA reads presentedCAHeader's value; false when it is
// absent or malformed (a forwarded request is served all the same).
func parsePresentedCA(v string) (string, time.Time, bool) {
	ca, secs, ok := strings.Cut(v, " ")
	if !ok || len(ca) != 2*sha256.Size {
		return "", time.Time{}, false
	}
	if _, err := hex.DecodeString(ca); err != nil {
		return "", time.Time{}, false
	}
	n, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return strings.ToLower(ca), time.Unix(n, 0), true
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
// records (state.LeaseTable.AgentTrust) and, with TLS, which CA issued
// the certificate each presents (state.LeaseTable.AgentCAs).
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
	tr := m.table.AgentTrust(out.SigningKey, silent)
	if m.security != nil {
		tr.ByCA = m.table.AgentCAs(silent)
	}
	if tr.OtherKeyCount+tr.RefusingCount+tr.FewPeersCount > 0 || len(tr.ByCA) > 0 || len(tr.ByMesh) > 0 {
		out.AgentTrust = &tr
	}
}
