package master

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/master/changestream"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/raftlog"
)

// writeAgent answers one agent's record, signed.
func (s *server) writeAgent(w http.ResponseWriter, info *api.AgentInfo) {
	s.m.table.SignAgent(info)
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

// writeState answers the state; its index header and body come from the
// same encoding.
func (s *server) writeState(w http.ResponseWriter) { s.writeStateFor(w, nil) }

// writeStateFor answers the state, gzip'ed when the request r (if not nil)
// accepts it. The body is encoded once per index and shared by readers.
func (s *server) writeStateFor(w http.ResponseWriter, r *http.Request) {
	leader, _ := s.m.node.Leader()
	b, err := s.m.table.StateBody(leader)
	if err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(stateIndexHeader, strconv.FormatUint(b.Index(), 10))
	w.Header().Add("Vary", "Accept-Encoding")
	w.Header().Set("ETag", b.ETag())
	if r != nil && etagMatches(r.Header.Get("If-None-Match"), b.ETag()) {
		// A poller that holds this state already: nothing to send.
		w.WriteHeader(http.StatusNotModified)
		return
	}
	data := b.Data()
	if r != nil && len(data) >= gzipMinBytes && acceptsGzip(r) {
		data = b.Gzipped()
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
	if consistent && !s.readOnLeader(w, r, "consistent read") {
		return
	}
	if !s.servable(w, consistent) {
		return
	}
	if blocking && !s.waitPast(r, index, wait, nil) {
		return
	}
	s.writeStateFor(w, r)
}

// readOnLeader makes a read linearizable: on the leader, after a read
// barrier; elsewhere it forwards the request to the leader. false means
// the request was answered (forwarded, or a 503 saying why).
func (s *server) readOnLeader(w http.ResponseWriter, r *http.Request, what string) bool {
	if !s.m.node.IsLeader() {
		s.forward(w, r, nil)
		return false
	}
	ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
	defer cancel()
	if _, err := s.m.node.ConsistentRead(ctx); err != nil {
		if errors.Is(err, raftlog.ErrNotLeader) {
			s.forward(w, r, nil)
			return false
		}
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("%s: %v", what, err))
		return false
	}
	return true
}

// waitPast waits until the state's index passes index, or the signing key
// changes, or a restore put the table behind index, or wait passed, or the
// master closes; false when the client went away. With a round ticket, a
// passed index waits further for the round that holds it
// (state.LeaseTable.Round), its ticket left in round for the caller to
// mark Done once answered: the changes watchers of a burst are answered
// together, a few times, rather than once per commit each.
func (s *server) waitPast(r *http.Request, index uint64, wait time.Duration, round *state.RoundTicket) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// A new signing key or chain (SIGHUP) is news too: the agents follow it at once.
	signing := s.m.table.SigningGeneration()
	for {
		ch, idx := s.m.table.Changed()
		if s.m.table.SigningGeneration() != signing || s.m.table.AheadOfRestore(index) {
			return true
		}
		if idx > index {
			if round == nil {
				return true
			}
			*round = s.m.table.Round(idx)
			select {
			case <-round.C:
				return true
			case <-s.m.runCtx.Done():
				return true
			case <-r.Context().Done():
				return false
			}
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
	// The round's wave waits for this answer (state.RoundTicket).
	var round state.RoundTicket
	defer round.Done()
	if !s.waitPast(r, since, wait, &round) {
		return
	}
	b, err := s.m.table.ChangesBody(since)
	var gone *changelog.GoneError
	switch {
	case errors.As(err, &gone):
		s.writeGone(w, since, gone.Oldest)
		return
	case err != nil:
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	// The answer is shared with every watcher at the same since: encoded
	// and gzip'ed once. A length spares the chunked framing of each.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(stateIndexHeader, strconv.FormatUint(b.Index(), 10))
	w.Header().Add("Vary", "Accept-Encoding")
	data := b.Data()
	if len(data) >= gzipMinBytes && acceptsGzip(r) {
		data = b.Gzipped()
		w.Header().Set("Content-Encoding", "gzip")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	if len(data) <= tlsRecordBytes {
		// One TLS record: nothing to batch.
		_, _ = w.Write(data)
		return
	}
	_ = httpapi.WriteLarge(w, r, data)
}

// tlsRecordBytes is the most a TLS record holds: a smaller answer goes out
// in one write anyway.
const tlsRecordBytes = 16 << 10

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

// changesStream serves GET /overlay-master/changes/stream?since=N[&heartbeat=D]
// (the stream itself: master/changestream) once this master may serve
// the state and still keeps the changes since N.
func (s *server) changesStream(w http.ResponseWriter, r *http.Request) {
	q, ok := changestream.ParseQuery(w, r)
	if !ok || !s.servable(w, false) {
		return
	}
	// A watcher already behind what is kept learns it before the stream
	// begins, as the long poll's does.
	if oldest := s.m.table.OldestChanges(); q.Since < oldest {
		s.writeGone(w, q.Since, oldest)
		return
	}
	q.Gzip = acceptsGzip(r)
	streams := &changestream.Server{
		Table: s.m.table, Identity: requestIdentity, Revoked: s.revokedClient, Stop: s.m.runCtx.Done(),
		WriteTimeout: s.m.opts.StreamWriteTimeout, GzipMinBytes: gzipMinBytes, Log: s.log,
		Open: s.m.metrics.streams, Ends: s.m.metrics.streamEnds,
	}
	streams.Serve(w, r, q)
}
