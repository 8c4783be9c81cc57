package master

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/raftlog"
)

// write is one write endpoint of the API (T its request body, R what doing
// it gives), described by the steps that differ from one write to the
// next. handleWrite runs them in the same order for every write, and every
// failure is answered by writeError.
type write[T, R any] struct {
	// body: the request carries a JSON body, decoded strictly into a T;
	// without one the T stays zero.
	body bool
	// prepare checks the request and its path and returns what to do on
	// the leader; an error is answered 400 with its message, which names
	// the field and the fix.
	prepare func(r *http.Request, req *T) (action[R], error)
	// authorize, when set, refuses (a *refusal: 403) what the caller's
	// identity may not ask for in this body. Who may call the route at all
	// is checked before, by the server's authorize middleware (auth.go).
	authorize func(r *http.Request, req *T) error
	// authorizeOnLeader, when set, refuses (403) what only the leader's
	// table can tell: a follower's may lag behind the log (a donor's
	// registration or claim key just committed), so a follower forwards
	// and the leader, checking the original caller's identity, decides.
	authorizeOnLeader func(r *http.Request, req *T) error
	// servable: refuse (503) while this master's table is not the
	// cluster's to serve, before forwarding.
	servable bool
	// unchanged, when set, says that the write would change nothing and
	// returns the record to answer: then, after a read barrier, the write
	// is answered without a log entry.
	unchanged func(r *http.Request, req *T) (*api.AgentInfo, bool)
	// answer writes the answer of a write done (the index header is set).
	answer func(w http.ResponseWriter, res R)
	// count, when set, counts how the write ended (metrics).
	count func(o writeOutcome, err error)
}

// action does a write on the leader and returns its result and the Raft
// index its answer reflects (0: none). Its error is answered by writeError.
type action[R any] func(ctx context.Context) (R, uint64, error)

// writeOutcome is how a write ended, for its metrics.
type writeOutcome int

const (
	// writeBadRequest: the body or the path failed its check (400).
	writeBadRequest writeOutcome = iota
	// writeUnchanged: answered without a log entry.
	writeUnchanged
	// writeFailed: not done after it passed its checks. count gets the
	// table's error, or nil when the write failed outside the table
	// (forwarded after all, no quorum, timeout).
	writeFailed
	// writeDone: done and answered.
	writeDone
)

// handleWrite is the handler of a write: read and decode the body,
// prepare (400), authorize (403), check that the table is servable (503),
// forward to the leader unless this master leads, authorize what only the
// leader's table can tell (403), answer an unchanged
// write after a read barrier, do it, answer it.
func handleWrite[T, R any](s *server, wr write[T, R]) http.HandlerFunc {
	counted := func(o writeOutcome, err error) {
		if wr.count != nil {
			wr.count(o, err)
		}
	}
	return func(w http.ResponseWriter, r *http.Request) {
		req := new(T)
		var body []byte
		if wr.body {
			var ok bool
			if body, ok = httpapi.ReadBody(w, r); !ok {
				return
			}
			if err := api.DecodeStrict(bytes.NewReader(body), req); err != nil {
				counted(writeBadRequest, nil)
				s.writeError(w, r, body, &badRequest{err})
				return
			}
		}
		act, err := wr.prepare(r, req)
		if err != nil {
			counted(writeBadRequest, nil)
			s.writeError(w, r, body, &badRequest{err})
			return
		}
		if wr.authorize != nil {
			if err := wr.authorize(r, req); err != nil {
				s.writeError(w, r, body, err)
				return
			}
		}
		if wr.servable && !s.servable(w, true) {
			return
		}
		if !s.m.node.IsLeader() {
			s.forward(w, r, body)
			return
		}
		if wr.authorizeOnLeader != nil {
			if err := wr.authorizeOnLeader(r, req); err != nil {
				s.writeError(w, r, body, err)
				return
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
		defer cancel()
		if wr.unchanged != nil {
			// Its index is what the barrier confirmed, and at least the
			// record's version: the follower that proxied it waits for
			// that as for a write.
			if info, readIndex, ok := s.unchangedAfterBarrier(ctx, func() (*api.AgentInfo, bool) { return wr.unchanged(r, req) }); ok {
				counted(writeUnchanged, nil)
				setIndex(w, max(readIndex, info.Version))
				s.writeAgent(w, info)
				return
			}
		}
		res, index, err := act(ctx)
		if err != nil {
			var pe *proposeError
			if errors.As(err, &pe) {
				counted(writeFailed, nil)
			} else {
				counted(writeFailed, err)
			}
			s.writeError(w, r, body, err)
			return
		}
		counted(writeDone, nil)
		if index > 0 {
			setIndex(w, index)
		}
		wr.answer(w, res)
	}
}

// proposeBody is the prepare of a write that proposes the command build
// makes of its body.
func proposeBody[T any](s *server, build func(req T) (logcmd.Command, error)) func(*http.Request, *T) (action[state.Result], error) {
	return func(_ *http.Request, req *T) (action[state.Result], error) {
		cmd, err := build(*req)
		return s.proposal(cmd), err
	}
}

// proposeForAgent is the prepare of a write that proposes the command
// build makes of the path's agent id and the body.
func proposeForAgent[T any](s *server, build func(agentID string, req T) (logcmd.Command, error)) func(*http.Request, *T) (action[state.Result], error) {
	return func(r *http.Request, req *T) (action[state.Result], error) {
		cmd, err := build(mux.Vars(r)["id"], *req)
		return s.proposal(cmd), err
	}
}

// proposal is the action that proposes cmd.
func (s *server) proposal(cmd logcmd.Command) action[state.Result] {
	return func(ctx context.Context) (state.Result, uint64, error) {
		res, index, err := s.m.apply(ctx, cmd)
		for _, warn := range res.Warnings {
			s.log.Warn("network config", "warning", warn)
		}
		return res, index, err
	}
}

// proposeError is a command that Raft did not commit and apply here (not
// the leader any more, leadership lost, a timeout, a closed node): the
// table never saw it, or its outcome is unknown.
type proposeError struct{ err error }

func (e *proposeError) Error() string { return e.err.Error() }
func (e *proposeError) Unwrap() error { return e.err }

// badRequest is a request that failed its check; its message names the
// field and the fix.
type badRequest struct{ err error }

func (e *badRequest) Error() string { return e.err.Error() }

// refusal is a request the caller's identity may not make (403), with the
// reason it is counted under (carve_master_auth_refusals_total).
type refusal struct{ reason, msg string }

func (e *refusal) Error() string { return e.msg }

// membershipError is a change of the Raft configuration that Raft refused
// (409).
type membershipError struct{ msg string }

func (e *membershipError) Error() string { return e.msg }

// writeError answers a write that failed: the one mapping of errors to
// statuses. A write this master could not propose as the leader goes to
// the new one.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, body []byte, err error) {
	var (
		bad        *badRequest
		ref        *refusal
		membership *membershipError
		pe         *proposeError
	)
	switch {
	case errors.As(err, &bad):
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
	case errors.As(err, &ref):
		s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, ref.reason, ref.msg)
	case errors.As(err, &membership):
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, err.Error())
	case errors.Is(err, raftlog.ErrNotLeader):
		// Surely not applied: the new leader can take it.
		s.forward(w, r, body)
	case errors.Is(err, raftlog.ErrLeadershipLost), errors.Is(err, raftlog.ErrUnknownOutcome):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable,
			"leadership changed while the write was in flight; its outcome is unknown: retry with the same request_id")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeTimeout, "the write did not commit in time; retry with the same request_id")
	case errors.As(err, &pe):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("raft: %v", err))
	case errors.Is(err, state.ErrVTEPExhausted):
		s.m.metrics.allocFailures.WithLabelValues("vtep_exhausted").Inc()
		httpapi.WriteError(w, http.StatusConflict, api.CodeExhausted, err.Error())
	case errors.Is(err, state.ErrOverlayExhausted):
		httpapi.WriteError(w, http.StatusConflict, api.CodeExhausted, err.Error())
	case errors.Is(err, state.ErrQuota):
		s.refuseQuota(w, r, err)
	case errors.Is(err, state.ErrBlockConflict), errors.Is(err, state.ErrRequestIDReused), errors.Is(err, state.ErrReportAhead),
		errors.Is(err, state.ErrKeyInUse), errors.Is(err, state.ErrStatementUsed):
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, err.Error())
	case errors.Is(err, state.ErrUnknownAgent), errors.Is(err, errUnknownServer):
		httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, state.ErrNoConfig):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
	case errors.Is(err, logcmd.ErrBadCommand), errors.Is(err, state.ErrInvalidBlock), errors.Is(err, state.ErrBadSnapshot):
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
	default:
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	}
}

// unchangedAfterBarrier tells whether a write would change nothing, asked
// again after a read barrier so that an answer without a log entry is not
// stale; it returns the record to answer and the index the barrier
// confirmed.
func (s *server) unchangedAfterBarrier(ctx context.Context, wouldChange func() (*api.AgentInfo, bool)) (*api.AgentInfo, uint64, bool) {
	if _, changes := wouldChange(); changes {
		return nil, 0, false
	}
	readIndex, err := s.m.node.ConsistentRead(ctx)
	if err != nil {
		return nil, 0, false
	}
	info, changes := wouldChange()
	if changes {
		return nil, 0, false
	}
	return info, readIndex, true
}
