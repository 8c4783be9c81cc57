package master

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/master/usage"
)

// The API's writes of agent records, each a write (write.go): the request
// it decodes, what it does on the leader, its answer and its metrics.

// Reasons of carve_master_grow_refused_total.
const (
	growRefusedExhausted = "exhausted"
	growRefusedInvalid   = "invalid"
	growRefusedUnknown   = "unknown_agent"
	growRefusedQuota     = "quota"
	growRefusedOther     = "other"
)

// countByResult counts writes in a counter labelled by result: ok,
// unchanged (no log entry needed), error, bad_request.
func countByResult(vec *prometheus.CounterVec) func(writeOutcome, error) {
	return func(o writeOutcome, _ error) {
		labels := [...]string{writeBadRequest: "bad_request", writeUnchanged: "unchanged", writeFailed: "error", writeDone: "ok"}
		vec.WithLabelValues(labels[o]).Inc()
	}
}

// register registers an agent or updates its record. A registration that
// changes nothing is answered without a log entry.
func (s *server) register() http.HandlerFunc {
	return handleWrite(s, write[api.RegisterRequest, state.Result]{
		body:    true,
		prepare: proposeBody(s, logcmd.RegisterCommand),
		unchanged: func(_ *http.Request, req *api.RegisterRequest) (*api.AgentInfo, bool) {
			return s.m.table.WouldChange(*req)
		},
		answer: func(w http.ResponseWriter, res state.Result) {
			for _, nl := range res.Agent.NotLeased {
				if strings.HasPrefix(nl.Reason, "exhausted") {
					s.m.metrics.allocFailures.WithLabelValues("overlay_subnet_exhausted").Inc()
				}
			}
			s.writeAgent(w, res.Agent)
		},
		count: countByResult(s.m.metrics.registrations),
	})
}

// report records an agent's configuration result per overlay (what the
// masters' state then shows as each overlay's state). A report the masters
// already hold is answered without a log entry, like an unchanged
// registration.
func (s *server) report() http.HandlerFunc {
	return handleWrite(s, write[api.ReportRequest, state.Result]{
		body:    true,
		prepare: proposeForAgent(s, logcmd.ReportCommand),
		unchanged: func(r *http.Request, req *api.ReportRequest) (*api.AgentInfo, bool) {
			return s.m.table.ReportWouldChange(mux.Vars(r)["id"], *req)
		},
		answer: s.answerAgent,
		count:  countByResult(s.m.metrics.reports),
	})
}

// deleteAgent deletes one agent, by id or underlay IP; 404 for a name
// never known.
func (s *server) deleteAgent() http.HandlerFunc {
	return handleWrite(s, write[struct{}, state.Result]{
		prepare: func(r *http.Request, _ *struct{}) (action[state.Result], error) {
			return s.proposal(logcmd.DeleteAgentCommand(mux.Vars(r)["id"])), nil
		},
		answer: func(w http.ResponseWriter, res state.Result) {
			httpapi.WriteJSON(w, http.StatusOK, map[string]any{"deleted": res.Deleted})
		},
	})
}

// deleteAgents is DC/OS's bulk delete: it answers the new state.
func (s *server) deleteAgents() http.HandlerFunc {
	return handleWrite(s, write[api.DeleteAgentsRequest, state.Result]{
		body:    true,
		prepare: proposeBody(s, logcmd.DeleteAgentsCommand),
		answer:  func(w http.ResponseWriter, _ state.Result) { s.writeState(w) },
	})
}

// grow leases the agent one more block.
func (s *server) grow() http.HandlerFunc {
	return handleWrite(s, write[api.GrowRequest, state.Result]{
		body:     true,
		prepare:  proposeForAgent(s, logcmd.GrowCommand),
		servable: true,
		answer:   s.answerAgent,
		count: func(o writeOutcome, err error) {
			switch {
			case o == writeDone:
				s.m.metrics.grown.Inc()
			case o == writeBadRequest:
				s.m.metrics.growRefused.WithLabelValues(growRefusedInvalid).Inc()
			case err == nil: // not refused by the table: no quorum, forwarded
			case errors.Is(err, state.ErrOverlayExhausted):
				s.m.metrics.growRefused.WithLabelValues(growRefusedExhausted).Inc()
			case errors.Is(err, state.ErrQuota):
				s.m.metrics.growRefused.WithLabelValues(growRefusedQuota).Inc()
			case errors.Is(err, state.ErrInvalidBlock):
				s.m.metrics.growRefused.WithLabelValues(growRefusedInvalid).Inc()
			case errors.Is(err, state.ErrUnknownAgent):
				s.m.metrics.growRefused.WithLabelValues(growRefusedUnknown).Inc()
			default:
				s.m.metrics.growRefused.WithLabelValues(growRefusedOther).Inc()
			}
		},
	})
}

// returnBlock gives back what the agent holds inside a prefix.
func (s *server) returnBlock() http.HandlerFunc {
	return handleWrite(s, write[api.ReturnRequest, state.Result]{
		body:     true,
		prepare:  proposeForAgent(s, logcmd.ReturnCommand),
		servable: true,
		answer:   s.answerAgent,
		count:    countDone(s.m.metrics.returned),
	})
}

// reportGrant records a ring grant that its donor or its recipient reports.
func (s *server) reportGrant() http.HandlerFunc {
	return handleWrite(s, write[api.GrantReport, state.Result]{
		body:              true,
		prepare:           proposeForAgent(s, logcmd.GrantCommand),
		authorize:         s.authorizeGrantCaller,
		authorizeOnLeader: s.authorizeGrant,
		servable:          true,
		answer:            s.answerAgent,
		count:             countDone(s.m.metrics.grantsLearned),
	})
}

// countDone counts the writes done in c.
func countDone(c prometheus.Counter) func(writeOutcome, error) {
	return func(o writeOutcome, _ error) {
		if o == writeDone {
			c.Inc()
		}
	}
}

// usage keeps an agent's usage report; on the leader, which is the master
// that proposes quarantine releases from the acknowledgements in them. It
// writes no log entry.
func (s *server) usage() http.HandlerFunc {
	return handleWrite(s, write[api.UsageReport, api.UsageAnswer]{
		body: true,
		prepare: func(r *http.Request, req *api.UsageReport) (action[api.UsageAnswer], error) {
			if err := usage.Validate(req); err != nil {
				return nil, err
			}
			return func(context.Context) (api.UsageAnswer, uint64, error) {
				ans, err := s.m.table.RecordUsage(mux.Vars(r)["id"], req)
				return ans, 0, err
			}, nil
		},
		answer: func(w http.ResponseWriter, ans api.UsageAnswer) {
			if ans.Acknowledged > 0 {
				s.m.kickRelease()
			}
			httpapi.WriteJSON(w, http.StatusOK, ans)
		},
	})
}

// answerAgent answers a write with the record it left.
func (s *server) answerAgent(w http.ResponseWriter, res state.Result) { s.writeAgent(w, res.Agent) }
