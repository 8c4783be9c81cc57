package master

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/raftlog"
)

// MaxBodyBytes is the largest request body a master reads.
const MaxBodyBytes = 1 << 20

// indexHeader carries the Raft index of a committed write.
const indexHeader = "X-Carve-Index"

// forwardedHeader marks a request proxied by a follower, so that a leader
// change in between cannot make two followers bounce it between them.
const forwardedHeader = "X-Carve-Forwarded-By"

// Wait bounds of blocking state queries.
const (
	defaultWait  = 30 * time.Second
	maxWait      = 10 * time.Minute
	applyTimeout = 15 * time.Second
)

var agentIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$`)

// server is the master's HTTP API.
type server struct {
	m      *Master
	log    *slog.Logger
	client *http.Client // for proxying to the leader
}

func (m *Master) routes() http.Handler {
	s := &server{m: m, log: m.log, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	r := mux.NewRouter()
	r.HandleFunc("/overlay-master/agents", s.register).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/delete", s.deleteAgents).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}", s.getAgent).Methods(http.MethodGet)
	r.HandleFunc("/overlay-master/agents/{id}", s.deleteAgent).Methods(http.MethodDelete)
	r.HandleFunc("/overlay-master/state", s.state).Methods(http.MethodGet)
	r.HandleFunc("/cluster/status", s.clusterStatus).Methods(http.MethodGet)
	r.HandleFunc("/cluster/join", s.join).Methods(http.MethodPost)
	r.HandleFunc("/cluster/servers/{id}", s.removeServer).Methods(http.MethodDelete)
	r.HandleFunc("/healthz", s.healthz).Methods(http.MethodGet)
	r.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, api.CodeBadRequest, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
	})
	return s.instrument(r)
}

// instrument counts requests by route and status.
func (s *server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		route := "other"
		if m := mux.CurrentRoute(r); m != nil {
			if tpl, err := m.GetPathTemplate(); err == nil {
				route = tpl
			}
		} else if strings.HasPrefix(r.URL.Path, "/overlay-master/") || strings.HasPrefix(r.URL.Path, "/cluster/") {
			route = routeTemplate(r.URL.Path)
		}
		s.m.metrics.httpRequests.WithLabelValues(r.Method, route, strconv.Itoa(rec.status)).Inc()
	})
}

// routeTemplate bounds label cardinality for paths that matched no route.
func routeTemplate(path string) string {
	switch {
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
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, api.Error{Message: msg, Code: code})
}

// readBody reads a request body up to MaxBodyBytes; false means an error
// answer was written.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, api.CodeTooLarge, fmt.Sprintf("request body larger than %d bytes", MaxBodyBytes))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("read request body: %v", err))
		return nil, false
	}
	return body, true
}

// decodeBody strictly decodes a JSON body; false means an error answer was written.
func decodeBody(w http.ResponseWriter, body []byte, v any) bool {
	if err := decodeStrict(bytes.NewReader(body), v); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return false
	}
	return true
}

// ValidateRegistration checks a registration and names the bad field.
func ValidateRegistration(req *api.RegisterRequest) error {
	if req.AgentID == "" {
		return errors.New("agent_id is required")
	}
	if !agentIDRE.MatchString(req.AgentID) {
		return fmt.Errorf("agent_id %q: want 1-253 characters of [A-Za-z0-9._:@-], starting with a letter or digit", req.AgentID)
	}
	if req.IP == "" {
		return errors.New("ip is required (the agent's underlay address)")
	}
	ip, err := netip.ParseAddr(req.IP)
	if err != nil || ip.Zone() != "" {
		return fmt.Errorf("ip %q is not an IP address", req.IP)
	}
	if ip.Is4In6() {
		return fmt.Errorf("ip %q: write IPv4 addresses in dotted form", req.IP)
	}
	if ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() || (ip.Is4() && ip == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
		return fmt.Errorf("ip %q cannot be an agent's underlay address", req.IP)
	}
	if len(req.Hostname) > 253 || strings.ContainsFunc(req.Hostname, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return fmt.Errorf("hostname %q: want at most 253 printable characters", req.Hostname)
	}
	if req.MeshAddr != "" {
		host, port, err := net.SplitHostPort(req.MeshAddr)
		if err != nil || host == "" {
			return fmt.Errorf("mesh_addr %q: want HOST:PORT", req.MeshAddr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("mesh_addr %q: port must be 1-65535", req.MeshAddr)
		}
	}
	if len(req.RequestID) > 128 {
		return errors.New("request_id: at most 128 characters")
	}
	return nil
}

func (s *server) register(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req api.RegisterRequest
	if !decodeBody(w, body, &req) {
		s.m.metrics.registrations.WithLabelValues("bad_request").Inc()
		return
	}
	if err := ValidateRegistration(&req); err != nil {
		s.m.metrics.registrations.WithLabelValues("bad_request").Inc()
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	if !s.m.node.IsLeader() {
		s.forward(w, r, body)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	// A registration that changes nothing is answered without a log entry,
	// after a read barrier so that the answer is not stale.
	if _, changes := s.m.table.WouldChange(req); !changes {
		if _, err := s.m.node.ConsistentRead(ctx); err == nil {
			if info, changes := s.m.table.WouldChange(req); !changes {
				s.m.metrics.registrations.WithLabelValues("unchanged").Inc()
				writeJSON(w, http.StatusOK, info)
				return
			}
		}
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
	for _, ov := range res.Agent.Overlays {
		if ov.State.Status == api.StatusFailed || strings.HasPrefix(ov.State.Error, "exhausted") {
			s.m.metrics.allocFailures.WithLabelValues("overlay_subnet_exhausted").Inc()
		}
	}
	writeJSON(w, http.StatusOK, res.Agent)
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
	res, handled := s.apply(ctx, w, r, body, cmd)
	if handled {
		return res, false
	}
	if res.Err != nil {
		s.writeApplyError(w, res.Err)
		return res, false
	}
	return res, true
}

// apply proposes a command on the leader. handled=true means an answer was
// written (forwarded to a new leader, or an error).
func (s *server) apply(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte, cmd command) (applyResult, bool) {
	data, err := encodeCommand(cmd)
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return applyResult{}, true
	}
	out, index, err := s.m.node.Apply(ctx, data)
	switch {
	case err == nil:
	case errors.Is(err, raftlog.ErrNotLeader):
		// Surely not applied: the new leader can take it.
		s.forward(w, r, body)
		return applyResult{}, true
	case errors.Is(err, raftlog.ErrLeadershipLost), errors.Is(err, raftlog.ErrUnknownOutcome):
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable,
			"leadership changed while the write was in flight; its outcome is unknown: retry with the same request_id")
		return applyResult{}, true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, api.CodeTimeout, "the write did not commit in time; retry with the same request_id")
		return applyResult{}, true
	default:
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("raft: %v", err))
		return applyResult{}, true
	}
	res, ok := out.(applyResult)
	if !ok {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("unexpected apply result %T", out))
		return applyResult{}, true
	}
	for _, warn := range res.Warnings {
		s.log.Warn("network config", "warning", warn)
	}
	// The follower that proxied this write waits for this index before it
	// answers, so a client reads its own writes from the master it used.
	w.Header().Set(indexHeader, strconv.FormatUint(index, 10))
	return res, false
}

func (s *server) writeApplyError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrVTEPExhausted):
		s.m.metrics.allocFailures.WithLabelValues("vtep_exhausted").Inc()
		writeError(w, http.StatusConflict, api.CodeExhausted, err.Error())
	case errors.Is(err, ErrUnknownAgent):
		writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, ErrNoConfig):
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
	case errors.Is(err, ErrBadCommand):
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	}
}

// forward proxies a request to the leader and copies its answer back.
func (s *server) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	if r.Header.Get(forwardedHeader) != "" {
		writeError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "this master is not the leader any more; retry")
		return
	}
	leaderID, _ := s.m.node.Leader()
	if leaderID == "" {
		writeError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "no leader elected yet; retry")
		return
	}
	meta, ok := s.m.table.Server(leaderID)
	if !ok || meta.HTTPAddr == "" || leaderID == s.m.opts.ID {
		writeError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("leader %s has not published its HTTP address yet; retry", leaderID))
		return
	}
	target := "http://" + meta.HTTPAddr + r.URL.RequestURI()
	req, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	req.Header.Set("Content-Type", r.Header.Get("Content-Type"))
	req.Header.Set(forwardedHeader, s.m.opts.ID)
	resp, err := s.client.Do(req)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("forward to leader %s at %s: %v; retry", leaderID, meta.HTTPAddr, err))
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
	for _, h := range []string{"Content-Type", "Retry-After", indexHeader} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (s *server) getAgent(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	info, ok := s.m.table.Agent(id)
	if !ok {
		if v, gone := s.m.table.Tombstone(id); gone {
			writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("agent %q was deleted at index %d", id, v))
			return
		}
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("unknown agent %q", id))
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *server) deleteAgent(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	res, ok := s.commit(w, r, nil, command{Op: opDelete, Delete: &deleteCmd{Agents: []string{id}, Strict: true}})
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": res.Deleted})
}

func (s *server) deleteAgents(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req api.DeleteAgentsRequest
	if !decodeBody(w, body, &req) {
		return
	}
	if len(req.Agents) == 0 {
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, "agents: want a non-empty list of agent ids or IPs")
		return
	}
	for i, a := range req.Agents {
		if a == "" {
			writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("agents[%d] is empty", i))
			return
		}
	}
	if _, ok := s.commit(w, r, body, command{Op: opDelete, RequestID: req.RequestID, Delete: &deleteCmd{Agents: req.Agents}}); !ok {
		return
	}
	s.writeState(w)
}

func (s *server) writeState(w http.ResponseWriter) {
	leader, _ := s.m.node.Leader()
	data, _, err := s.m.table.StateJSON(leader)
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Carve-State-Index", strconv.FormatUint(s.m.table.Index(), 10))
	_, _ = w.Write(data)
}

func (s *server) state(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "consistent" && k != "index" && k != "wait" {
			writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("unknown query parameter %q (want consistent, index, wait)", k))
			return
		}
	}
	consistent := false
	if v := q.Get("consistent"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("consistent=%q: want true or false", v))
			return
		}
		consistent = b
	}
	var index uint64
	blocking := q.Has("index")
	if blocking {
		v, err := strconv.ParseUint(q.Get("index"), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("index=%q: want a non-negative integer", q.Get("index")))
			return
		}
		index = v
	}
	wait := defaultWait
	if v := q.Get("wait"); v != "" {
		d, err := parseWait(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		wait = d
		blocking = true
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
			writeError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("consistent read: %v", err))
			return
		}
	}
	if blocking {
		timer := time.NewTimer(wait)
		defer timer.Stop()
	wait:
		for {
			ch, idx := s.m.table.Changed()
			if idx > index {
				break
			}
			select {
			case <-ch:
			case <-timer.C:
				break wait
			case <-s.m.runCtx.Done():
				break wait
			case <-r.Context().Done():
				return
			}
		}
	}
	s.writeState(w)
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
	writeJSON(w, http.StatusOK, s.m.ClusterStatus())
}

func (s *server) join(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req api.JoinRequest
	if !decodeBody(w, body, &req) {
		return
	}
	if req.ID == "" {
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, "id is required")
		return
	}
	if _, _, err := net.SplitHostPort(req.RaftAddr); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("raft_addr %q: want HOST:PORT", req.RaftAddr))
		return
	}
	if req.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(req.HTTPAddr); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("http_addr %q: want HOST:PORT", req.HTTPAddr))
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
		writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("add voter %s at %s: %v", req.ID, req.RaftAddr, err))
		return
	}
	s.log.Info("master joined", "id", req.ID, "raft_addr", req.RaftAddr, "http_addr", req.HTTPAddr)
	writeJSON(w, http.StatusOK, s.m.ClusterStatus())
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
		writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("remove server %s: %v", id, err))
		return
	}
	s.log.Info("master removed", "id", id)
	writeJSON(w, http.StatusOK, s.m.ClusterStatus())
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	st := s.m.node.Status()
	if st.Role == "shutdown" {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "raft is shut down")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "id": s.m.opts.ID, "role": st.Role})
}
