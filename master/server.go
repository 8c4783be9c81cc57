package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/raftlog"
)

// MaxBodyBytes is the largest request body a master reads.
const MaxBodyBytes = httpapi.MaxBodyBytes

// Wait bounds of blocking state queries.
const (
	defaultWait  = 30 * time.Second
	maxWait      = 10 * time.Minute
	applyTimeout = 15 * time.Second
)

// server is the master's HTTP API.
type server struct {
	m      *Master
	log    *slog.Logger
	client *http.Client // for proxying to the leader
}

func (m *Master) routes() http.Handler {
	// A follower forwards many agents' writes at once: keeping that many
	// connections to the leader spares a TLS handshake per forwarded write.
	transport := &http.Transport{MaxIdleConnsPerHost: 1024, TLSHandshakeTimeout: 10 * time.Second}
	if m.security != nil {
		transport.TLSClientConfig = m.security.client
	}
	s := &server{m: m, log: m.log, client: &http.Client{Transport: transport}}
	r := httpapi.NewRouter()
	r.Use(recordRoute, s.authorize)
	r.HandleFunc("/overlay-master/agents", s.register).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/delete", s.deleteAgents).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}", s.getAgent).Methods(http.MethodGet)
	r.HandleFunc("/overlay-master/agents/{id}", s.deleteAgent).Methods(http.MethodDelete)
	r.HandleFunc("/overlay-master/agents/{id}/report", s.report).Methods(http.MethodPut)
	r.HandleFunc("/overlay-master/agents/{id}/blocks", s.grow).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}/blocks/return", s.returnBlock).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}/blocks/grants", s.reportGrant).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}/usage", s.usage).Methods(http.MethodPut)
	r.HandleFunc("/overlay-master/state", s.state).Methods(http.MethodGet)
	r.HandleFunc("/overlay-master/changes", s.changes).Methods(http.MethodGet)
	r.HandleFunc("/cluster/status", s.clusterStatus).Methods(http.MethodGet)
	r.HandleFunc("/cluster/join", s.join).Methods(http.MethodPost)
	r.HandleFunc("/cluster/servers/{id}", s.removeServer).Methods(http.MethodDelete)
	r.HandleFunc("/healthz", s.healthz).Methods(http.MethodGet)
	r.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	return s.instrument(s.authenticate(r))
}

// instrument counts requests by route and status.
func (s *server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := rec.route
		if route == "" {
			route = routeTemplate(r.URL.Path)
		}
		s.m.metrics.httpRequests.WithLabelValues(r.Method, route, strconv.Itoa(rec.status)).Inc()
	})
}

// recordRoute tells instrument which route served a request (a mux
// middleware: only the router knows; instrument runs outside it).
func recordRoute(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*statusRecorder); ok {
			if cur := mux.CurrentRoute(r); cur != nil {
				if tpl, err := cur.GetPathTemplate(); err == nil {
					rec.route = tpl
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// routeTemplate bounds label cardinality for paths that matched no route.
func routeTemplate(path string) string {
	switch {
	case strings.HasPrefix(path, "/overlay-master/agents/") && strings.HasSuffix(path, "/report"):
		return "/overlay-master/agents/{id}/report"
	case strings.HasPrefix(path, "/overlay-master/agents/"):
		return "/overlay-master/agents/{id}"
	case strings.HasPrefix(path, "/cluster/servers/"):
		return "/cluster/servers/{id}"
	}
	return "other"
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	route  string // the matched route's template, set by recordRoute
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// servable writes a 503 and returns false while this master's table is not
// the cluster's to serve: it has not caught up with a leader since it
// started (restarted without quorum, say: its table is empty or a snapshot's
// old one), or the cluster's first leader has not committed the network
// configuration yet (it commits the cluster id before it). The cluster id is
// not required: a leader of an older version commits none, and its
// followers must keep serving through a rolling upgrade. confirmed skips the
// first check for a read that a read barrier on the leader just confirmed.
func (s *server) servable(w http.ResponseWriter, confirmed bool) bool {
	if !confirmed && !s.m.node.IsCaughtUp() {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader,
			"this master has not caught up with a leader since it started (no quorum, or its log is still being replayed): it serves no state until it has; retry, or ask another master")
		return false
	}
	if _, ok := s.m.table.Network(); !ok {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable,
			"the cluster is not initialised yet: its first leader has not committed the network configuration; retry")
		return false
	}
	return true
}

func (s *server) register(w http.ResponseWriter, r *http.Request) {
	body, ok := httpapi.ReadBody(w, r)
	if !ok {
		return
	}
	var req api.RegisterRequest
	if !httpapi.DecodeBody(w, body, &req) {
		s.m.metrics.registrations.WithLabelValues("bad_request").Inc()
		return
	}
	if err := ValidateRegistration(&req); err != nil {
		s.m.metrics.registrations.WithLabelValues("bad_request").Inc()
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	if !s.m.node.IsLeader() {
		s.forward(w, r, body)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	// A registration that changes nothing is answered without a log entry,
	// after a read barrier so that the answer is not stale. Its index is what
	// the barrier confirmed (and at least the record's version): the
	// follower that proxied it waits for that as for a write.
	if info, readIndex, ok := s.unchangedAfterBarrier(ctx, func() (*api.AgentInfo, bool) { return s.m.table.WouldChange(req) }); ok {
		s.m.metrics.registrations.WithLabelValues("unchanged").Inc()
		setIndex(w, max(readIndex, info.Version))
		s.writeAgent(w, info)
		return
	}
	cmd := command{Op: opRegister, RequestID: req.RequestID, Register: &registerCmd{
		AgentID: req.AgentID, Hostname: req.Hostname, IP: req.IP, MeshAddr: req.MeshAddr, Bridges: req.NetworkConfig,
	}}
	res, ok := s.commit(w, r, body, cmd)
	if !ok {
		s.m.metrics.registrations.WithLabelValues("error").Inc()
		return
	}
	s.m.metrics.registrations.WithLabelValues("ok").Inc()
	for _, nl := range res.Agent.NotLeased {
		if strings.HasPrefix(nl.Reason, "exhausted") {
			s.m.metrics.allocFailures.WithLabelValues("overlay_subnet_exhausted").Inc()
		}
	}
	s.writeAgent(w, res.Agent)
}

// report records an agent's configuration result per overlay (what the
// masters' state then shows as each overlay's state). A report the masters
// already hold is answered without a log entry, after a read barrier, like
// an unchanged registration.
func (s *server) report(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	req, body, ok := readValid(w, r, func(req *api.ReportRequest) error {
		if err := api.ValidateAgentID(id); err != nil {
			return err
		}
		if _, err := reportOf(*req); err != nil {
			return err
		}
		return validateRequestID(req.RequestID)
	}, func() { s.m.metrics.reports.WithLabelValues("bad_request").Inc() })
	if !ok {
		return
	}
	if !s.m.node.IsLeader() {
		s.forward(w, r, body)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	if info, readIndex, ok := s.unchangedAfterBarrier(ctx, func() (*api.AgentInfo, bool) { return s.m.table.ReportWouldChange(id, *req) }); ok {
		s.m.metrics.reports.WithLabelValues("unchanged").Inc()
		setIndex(w, readIndex)
		s.writeAgent(w, info)
		return
	}
	requestID := req.RequestID
	req.RequestID = ""
	res, ok := s.commit(w, r, body, command{Op: opReport, RequestID: requestID, Report: &reportCmd{AgentID: id, Report: *req}})
	if !ok {
		s.m.metrics.reports.WithLabelValues("error").Inc()
		return
	}
	s.m.metrics.reports.WithLabelValues("ok").Inc()
	s.writeAgent(w, res.Agent)
}

// readValid reads a request body, decodes it strictly into a T and checks
// it; a body that does not decode or fails the check is answered 400,
// naming what is wrong, and counted by refused when it is set. It returns
// the raw body too, for a follower to forward to the leader.
func readValid[T any](w http.ResponseWriter, r *http.Request, check func(*T) error, refused func()) (*T, []byte, bool) {
	body, ok := httpapi.ReadBody(w, r)
	if !ok {
		return nil, nil, false
	}
	req := new(T)
	if !httpapi.DecodeBody(w, body, req) {
		if refused != nil {
			refused()
		}
		return nil, nil, false
	}
	if err := check(req); err != nil {
		if refused != nil {
			refused()
		}
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return nil, nil, false
	}
	return req, body, true
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

// writeAgent answers one agent's record, signed.
func (s *server) writeAgent(w http.ResponseWriter, info *api.AgentInfo) {
	s.m.table.signAgent(info)
	httpapi.WriteJSON(w, http.StatusOK, info)
}

func (s *server) getAgent(w http.ResponseWriter, r *http.Request) {
	if !s.servable(w, false) {
		return
	}
	id := mux.Vars(r)["id"]
	info, ok := s.m.table.Agent(id)
	if !ok {
		if v, gone := s.m.table.Tombstone(id); gone {
			httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("agent %q was deleted at index %d", id, v))
			return
		}
		httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("unknown agent %q", id))
		return
	}
	s.writeAgent(w, info)
}

func (s *server) deleteAgent(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	res, ok := s.commit(w, r, nil, command{Op: opDelete, Delete: &deleteCmd{Agents: []string{id}, Strict: true}})
	if !ok {
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"deleted": res.Deleted})
}

func (s *server) deleteAgents(w http.ResponseWriter, r *http.Request) {
	body, ok := httpapi.ReadBody(w, r)
	if !ok {
		return
	}
	var req api.DeleteAgentsRequest
	if !httpapi.DecodeBody(w, body, &req) {
		return
	}
	if len(req.Agents) == 0 {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "agents: want a non-empty list of agent ids or IPs")
		return
	}
	for i, a := range req.Agents {
		if a == "" {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("agents[%d] is empty", i))
			return
		}
	}
	if err := validateRequestID(req.RequestID); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	if _, ok := s.commit(w, r, body, command{Op: opDelete, RequestID: req.RequestID, Delete: &deleteCmd{Agents: req.Agents}}); !ok {
		return
	}
	s.writeState(w)
}

// writeState answers the state; its index header and body come from the
// same encoding.
func (s *server) writeState(w http.ResponseWriter) { s.writeStateFor(w, nil) }

// writeStateFor answers the state, gzip'ed when the request r (if not nil)
// accepts it. The body is encoded once per index and shared by readers.
func (s *server) writeStateFor(w http.ResponseWriter, r *http.Request) {
	leader, _ := s.m.node.Leader()
	b, err := s.m.table.stateBody(leader)
	if err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(stateIndexHeader, strconv.FormatUint(b.index, 10))
	w.Header().Add("Vary", "Accept-Encoding")
	w.Header().Set("ETag", b.ETag())
	if r != nil && etagMatches(r.Header.Get("If-None-Match"), b.ETag()) {
		// A poller that holds this state already: nothing to send.
		w.WriteHeader(http.StatusNotModified)
		return
	}
	data := b.data
	if r != nil && len(data) >= gzipMinBytes && acceptsGzip(r) {
		data = b.gzipped()
		w.Header().Set("Content-Encoding", "gzip")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	if r == nil {
		_, _ = w.Write(data)
		return
	}
	_ = httpapi.WriteLarge(w, r, data)
}

// etagMatches reports whether an If-None-Match header names etag (weak
// comparison, as RFC 9110 has for If-None-Match), or is "*".
func etagMatches(header, etag string) bool {
	if header == "" {
		return false
	}
	bare := strings.TrimPrefix(etag, "W/")
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == bare {
			return true
		}
	}
	return false
}

// gzipMinBytes: smaller states go plain (gzip would gain little).
const gzipMinBytes = 8 << 10

// acceptsGzip tells whether the request's Accept-Encoding allows gzip.
func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			return strings.ReplaceAll(strings.TrimSpace(params), " ", "") != "q=0"
		}
	}
	return false
}

func (s *server) state(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "consistent" && k != "index" && k != "wait" {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("unknown query parameter %q (want consistent, index, wait)", k))
			return
		}
	}
	consistent := false
	if v := q.Get("consistent"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("consistent=%q: want true or false", v))
			return
		}
		consistent = b
	}
	var index uint64
	blocking := q.Has("index")
	if blocking {
		v, err := strconv.ParseUint(q.Get("index"), 10, 64)
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("index=%q: want a non-negative integer", q.Get("index")))
			return
		}
		index = v
	}
	wait := defaultWait
	if v := q.Get("wait"); v != "" {
		d, err := parseWait(v)
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		wait = d
		blocking = true
	}
	if blocking {
		// The watch outlasts the server's read and write timeouts on
		// purpose; a consistent one may wait for the leader first.
		if err := httpapi.ExtendDeadlines(w, wait+2*applyTimeout); err != nil {
			httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("extend the watch's deadlines: %v", err))
			return
		}
	}
	if consistent {
		if !s.m.node.IsLeader() {
			s.forward(w, r, nil)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
		defer cancel()
		if _, err := s.m.node.ConsistentRead(ctx); err != nil {
			if errors.Is(err, raftlog.ErrNotLeader) {
				s.forward(w, r, nil)
				return
			}
			httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("consistent read: %v", err))
			return
		}
	}
	if !s.servable(w, consistent) {
		return
	}
	if blocking && !s.waitPast(r, index, wait) {
		return
	}
	s.writeStateFor(w, r)
}

// waitPast waits until the state's index passes index, or wait passed, or
// the master closes; false when the client went away.
func (s *server) waitPast(r *http.Request, index uint64, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch, idx := s.m.table.Changed()
		if idx > index {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return true
		case <-s.m.runCtx.Done():
			return true
		case <-r.Context().Done():
			return false
		}
	}
}

// changes answers GET /overlay-master/changes?since=N&wait=D: as soon as the
// state's index passes N (or after D), what changed after N (api.Changes);
// 410 {"error","code":"gone","oldest"} when N is older than what this
// master keeps. Served by any master that may serve the state.
func (s *server) changes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "since" && k != "wait" {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("unknown query parameter %q (want since, wait)", k))
			return
		}
	}
	if !q.Has("since") {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "since is required: the index of the last state or changes read")
		return
	}
	since, err := strconv.ParseUint(q.Get("since"), 10, 64)
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("since=%q: want a non-negative integer", q.Get("since")))
		return
	}
	wait := defaultWait
	if v := q.Get("wait"); v != "" {
		if wait, err = parseWait(v); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
	}
	if err := httpapi.ExtendDeadlines(w, wait+2*applyTimeout); err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("extend the watch's deadlines: %v", err))
		return
	}
	if !s.servable(w, false) {
		return
	}
	// A watcher already behind what is kept learns it at once.
	if oldest := s.m.table.OldestChanges(); since < oldest {
		s.writeGone(w, since, oldest)
		return
	}
	if !s.waitPast(r, since, wait) {
		return
	}
	data, index, err := s.m.table.ChangesJSON(since)
	var gone *GoneError
	switch {
	case errors.As(err, &gone):
		s.writeGone(w, since, gone.Oldest)
		return
	case err != nil:
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(stateIndexHeader, strconv.FormatUint(index, 10))
	_, _ = w.Write(data)
}

// writeGone answers 410: changes since that index are not kept.
func (s *server) writeGone(w http.ResponseWriter, since, oldest uint64) {
	httpapi.WriteJSON(w, http.StatusGone, api.Error{Code: api.CodeGone, Oldest: oldest,
		Message: fmt.Sprintf("changes since index %d are not kept (the oldest served is %d, after a compaction, a snapshot or a long absence): read the whole state", since, oldest)})
}

// parseWait accepts a Go duration ("30s") or plain seconds ("30").
func parseWait(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, err2 := strconv.ParseUint(v, 10, 32)
		if err2 != nil {
			return 0, fmt.Errorf("wait=%q: want a duration like 30s", v)
		}
		d = time.Duration(secs) * time.Second
	}
	if d < 0 || d > maxWait {
		return 0, fmt.Errorf("wait=%q: want between 0s and %s", v, maxWait)
	}
	return d, nil
}

func (s *server) clusterStatus(w http.ResponseWriter, r *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, s.m.ClusterStatus())
}

func (s *server) join(w http.ResponseWriter, r *http.Request) {
	body, ok := httpapi.ReadBody(w, r)
	if !ok {
		return
	}
	var req api.JoinRequest
	if !httpapi.DecodeBody(w, body, &req) {
		return
	}
	if req.ID == "" {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "id is required")
		return
	}
	if err := checkAdvertisedAddr(req.RaftAddr); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("raft_addr %q: %v", req.RaftAddr, err))
		return
	}
	if req.HTTPAddr != "" {
		if err := checkAdvertisedAddr(req.HTTPAddr); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("http_addr %q: %v", req.HTTPAddr, err))
			return
		}
	}
	if !s.m.node.IsLeader() {
		s.forward(w, r, body)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	if req.HTTPAddr != "" {
		meta := &serverMeta{ID: req.ID, RaftAddr: req.RaftAddr, HTTPAddr: req.HTTPAddr}
		if _, ok := s.commit(w, r, body, command{Op: opServerMeta, ServerMeta: meta}); !ok {
			return
		}
	}
	if err := s.m.node.AddVoter(ctx, req.ID, req.RaftAddr); err != nil {
		if errors.Is(err, raftlog.ErrNotLeader) {
			s.forward(w, r, body)
			return
		}
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("add voter %s at %s: %v", req.ID, req.RaftAddr, err))
		return
	}
	s.log.Info("master joined", "id", req.ID, "raft_addr", req.RaftAddr, "http_addr", req.HTTPAddr)
	httpapi.WriteJSON(w, http.StatusOK, s.m.ClusterStatus())
}

func (s *server) removeServer(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if !s.m.node.IsLeader() {
		s.forward(w, r, nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	if err := s.m.node.RemoveServer(ctx, id); err != nil {
		if errors.Is(err, raftlog.ErrNotLeader) {
			s.forward(w, r, nil)
			return
		}
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("remove server %s: %v", id, err))
		return
	}
	s.log.Info("master removed", "id", id)
	httpapi.WriteJSON(w, http.StatusOK, s.m.ClusterStatus())
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	st := s.m.node.Status()
	if st.Role == "shutdown" {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "raft is shut down")
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "id": s.m.opts.ID, "role": st.Role, "caught_up": st.CaughtUp})
}
