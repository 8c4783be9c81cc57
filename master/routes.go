package master

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/loglevel"
)

// MaxBodyBytes is the largest request body a master reads.
const MaxBodyBytes = httpapi.MaxBodyBytes

// Wait bounds of blocking state queries.
const (
	defaultWait  = 30 * time.Second
	maxWait      = 10 * time.Minute
	applyTimeout = 15 * time.Second
)

// server is the master's HTTP API. Its writes all take the steps of
// handleWrite (write.go); reads are in reads.go.
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
		transport.DialTLSContext = m.security.files.DialTLS(m.security.client, transport.TLSHandshakeTimeout, nil)
	}
	s := &server{m: m, log: m.log, client: &http.Client{Transport: transport}}
	r := httpapi.NewRouter()
	r.Use(recordRoute, s.authorize, s.noteHeard)
	r.HandleFunc("/overlay-master/agents", s.register()).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/delete", s.deleteAgents()).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}", s.getAgent).Methods(http.MethodGet)
	r.HandleFunc("/overlay-master/agents/{id}", s.deleteAgent()).Methods(http.MethodDelete)
	r.HandleFunc("/overlay-master/agents/{id}/report", s.report()).Methods(http.MethodPut)
	r.HandleFunc("/overlay-master/agents/{id}/blocks", s.grow()).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}/blocks/return", s.returnBlock()).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}/blocks/grants", s.reportGrant()).Methods(http.MethodPost)
	r.HandleFunc("/overlay-master/agents/{id}/usage", s.usage()).Methods(http.MethodPut)
	r.HandleFunc("/overlay-master/state", s.state).Methods(http.MethodGet)
	r.HandleFunc("/overlay-master/changes", s.changes).Methods(http.MethodGet)
	r.HandleFunc(api.StreamPath, s.changesStream).Methods(http.MethodGet)
	r.HandleFunc("/cluster/status", s.clusterStatus).Methods(http.MethodGet)
	r.HandleFunc("/cluster/join", s.join()).Methods(http.MethodPost)
	r.HandleFunc("/cluster/servers/{id}", s.removeServer()).Methods(http.MethodDelete)
	r.HandleFunc("/cluster/revocations", s.revoke()).Methods(http.MethodPost)
	r.HandleFunc("/cluster/revocations", s.revocations).Methods(http.MethodGet)
	r.HandleFunc("/cluster/config", s.configShow).Methods(http.MethodGet)
	r.HandleFunc("/cluster/config", s.configApply()).Methods(http.MethodPut)
	r.HandleFunc("/cluster/snapshot", s.snapshot).Methods(http.MethodGet)
	r.HandleFunc("/cluster/restore", s.restore()).Methods(http.MethodPost)
	r.HandleFunc("/healthz", s.healthz).Methods(http.MethodGet)
	if m.opts.LogLevel != nil {
		r.HandleFunc(loglevel.Path, loglevel.Handler(m.opts.LogLevel, m.log)).Methods(http.MethodGet, http.MethodPut)
	}
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

// FlushError flushes and says whether it could: http.ResponseController
// prefers it to Flush, which has no error to return. Without it a changes
// stream took a frame whose flush failed (its client stopped reading) for
// written (master/changestream).
func (r *statusRecorder) FlushError() error {
	return http.NewResponseController(r.ResponseWriter).Flush()
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
