package master

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/raftlog"
)

// indexHeader carries the Raft index a write's answer reflects: a client (or
// the follower that proxied the write) that waits for it reads its own write.
const indexHeader = "X-Carve-Index"

// stateIndexHeader carries the index of the state in the answer's body.
const stateIndexHeader = "X-Carve-State-Index"

// forwardedHeader marks a request proxied by a follower, so that a leader
// change in between cannot make two followers bounce it between them.
const forwardedHeader = "X-Carve-Forwarded-By"

// setIndex sets the index header of a write's answer.
func setIndex(w http.ResponseWriter, index uint64) {
	w.Header().Set(indexHeader, strconv.FormatUint(index, 10))
}

// commit proposes cmd on the leader, or proxies the request to the leader
// when this master does not lead. ok=false means an answer was written.
func (s *server) commit(w http.ResponseWriter, r *http.Request, body []byte, cmd command) (res applyResult, ok bool) {
	if !s.m.node.IsLeader() {
		s.forward(w, r, body)
		return applyResult{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	res, index, handled := s.apply(ctx, w, r, body, cmd)
	if handled {
		return res, false
	}
	if res.Err != nil {
		s.writeApplyError(w, res.Err)
		return res, false
	}
	setIndex(w, index)
	return res, true
}

// apply proposes a command on the leader and returns its result and log
// index. handled=true means an answer was written (forwarded to a new
// leader, or an error).
func (s *server) apply(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte, cmd command) (applyResult, uint64, bool) {
	data, err := encodeCommand(cmd)
	if err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return applyResult{}, 0, true
	}
	out, index, err := s.m.node.Apply(ctx, data)
	switch {
	case err == nil:
	case errors.Is(err, raftlog.ErrNotLeader):
		// Surely not applied: the new leader can take it.
		s.forward(w, r, body)
		return applyResult{}, 0, true
	case errors.Is(err, raftlog.ErrLeadershipLost), errors.Is(err, raftlog.ErrUnknownOutcome):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable,
			"leadership changed while the write was in flight; its outcome is unknown: retry with the same request_id")
		return applyResult{}, 0, true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeTimeout, "the write did not commit in time; retry with the same request_id")
		return applyResult{}, 0, true
	default:
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("raft: %v", err))
		return applyResult{}, 0, true
	}
	res, ok := out.(applyResult)
	if !ok {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("unexpected apply result %T", out))
		return applyResult{}, 0, true
	}
	for _, warn := range res.Warnings {
		s.log.Warn("network config", "warning", warn)
	}
	return res, index, false
}

func (s *server) writeApplyError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrVTEPExhausted):
		s.m.metrics.allocFailures.WithLabelValues("vtep_exhausted").Inc()
		httpapi.WriteError(w, http.StatusConflict, api.CodeExhausted, err.Error())
	case errors.Is(err, ErrOverlayExhausted):
		httpapi.WriteError(w, http.StatusConflict, api.CodeExhausted, err.Error())
	case errors.Is(err, ErrBlockConflict), errors.Is(err, ErrRequestIDReused), errors.Is(err, ErrReportAhead):
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, err.Error())
	case errors.Is(err, ErrUnknownAgent):
		httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, ErrNoConfig):
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
	case errors.Is(err, ErrBadCommand), errors.Is(err, ErrInvalidBlock):
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
	default:
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	}
}

// forward proxies a request to the leader and copies its answer back. A
// successful write's answer carries the index it reflects; the answer waits
// until this master has applied it, so that the client reads its own write
// here.
func (s *server) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	if r.Header.Get(forwardedHeader) != "" {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "this master is not the leader any more; retry")
		return
	}
	leaderID, _ := s.m.node.Leader()
	if leaderID == "" {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "no leader elected yet; retry")
		return
	}
	meta, ok := s.m.table.Server(leaderID)
	if !ok || meta.HTTPAddr == "" || leaderID == s.m.opts.ID {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("leader %s has not published its HTTP address yet; retry", leaderID))
		return
	}
	target := s.m.scheme() + meta.HTTPAddr + r.URL.RequestURI()
	req, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
	if err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	req.Header.Set("Content-Type", r.Header.Get("Content-Type"))
	req.Header.Set(forwardedHeader, s.m.opts.ID)
	if id, ok := requestIdentity(r); ok {
		// The leader authorizes the client, not this master.
		req.Header.Set(identityHeader, id.String())
	}
	resp, err := s.client.Do(req)
	if err != nil {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("forward to leader %s at %s: %v; retry", leaderID, meta.HTTPAddr, err))
		return
	}
	defer resp.Body.Close()
	s.m.metrics.forwarded.Inc()
	if idx, err := strconv.ParseUint(resp.Header.Get(indexHeader), 10, 64); err == nil && resp.StatusCode < 300 {
		ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
		if err := s.m.node.WaitApplied(ctx, idx); err != nil {
			s.log.Warn("proxied write committed but not yet applied here", "index", idx, "err", err)
		}
		cancel()
	}
	for _, h := range []string{"Content-Type", "Retry-After", indexHeader, stateIndexHeader} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
