package master

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/pki"
)

// The changes stream: GET /overlay-master/changes/stream?since=N.
//
// The long poll (changes, reads.go) costs every watcher, at every change,
// a request: its TLS record, header parse, routing, authentication and a
// new answer on the master, a new request on the agent. A stream is one
// request per agent for as long as it lives: the master writes each
// change as a frame (api/stream.go), the same api.Changes the long poll
// answers, from the same shared encoding (state.LeaseTable.ChangesBody:
// encoded once per since, gzip'ed once, written to every stream at that
// index), in the same rounds. Between changes a heartbeat frame every
// heartbeat=D tells the agent the master is alive, and the master that a
// connection is (a write to a dead one fails). A stream holds no queue: it
// asks for the changes since its own index when it is ready to write, so a
// stream that fell behind gets one frame of everything it missed, and one
// whose client does not read blocks in a write until its deadline and is
// dropped (logged with the reason); its agent opens it again from its
// index. The deadline is moved at every frameChunk written: a client that
// reads a large frame slowly is not dropped. The stream ends with an end
// frame carrying the error code the long poll would have answered: gone
// (410: the changes since its index are not kept, or the table was
// restored behind it), revoked (the client's certificate was revoked since
// the stream began: checked before every frame), unavailable (the master
// stops).

// DefaultStreamWriteTimeout is Options.StreamWriteTimeout's default: it
// bounds, past the heartbeat, the write of each frameChunk of a frame: a
// client that does not read for that long (its socket buffers full) is
// dropped.
const DefaultStreamWriteTimeout = 15 * time.Second

// streamContentType names the frames' format (api/stream.go).
const streamContentType = "application/x-carve-changes-stream"

// changesStream serves GET /overlay-master/changes/stream?since=N[&heartbeat=D].
func (s *server) changesStream(w http.ResponseWriter, r *http.Request) {
	since, hb, ok := parseStreamQuery(w, r)
	if !ok || !s.servable(w, false) {
		return
	}
	// A watcher already behind what is kept learns it before the stream
	// begins, as the long poll's does.
	if oldest := s.m.table.OldestChanges(); since < oldest {
		s.writeGone(w, since, oldest)
		return
	}
	st := &changeStream{s: s, w: w, r: r, rc: http.NewResponseController(w), hb: hb, gzip: acceptsGzip(r), index: since}
	if err := st.extend(); err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("extend the stream's deadlines: %v", err))
		return
	}
	w.Header().Set("Content-Type", streamContentType)
	w.Header().Set("Cache-Control", "no-store")
	// A stream ends rarely (a revocation, a 410, a drop): its connection
	// is not kept for another request, so that one whose certificate was
	// revoked is not reused either.
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusOK)
	s.m.metrics.streams.Inc()
	reason, err := st.run()
	s.m.metrics.streams.Dec()
	s.m.metrics.streamEnds.WithLabelValues(streamEndLabel(reason)).Inc()
	switch {
	case reason == streamEndWrite:
		// The one end the client is not told of: said where the
		// operator looks.
		s.log.Info("dropped a changes stream", "remote", r.RemoteAddr, "client", clientName(r), "index", st.index, "reason", reason, "err", err)
	case err != nil:
		// An end frame told the client why (a master stopping ends
		// thousands at once).
		s.log.Debug("ended a changes stream", "remote", r.RemoteAddr, "client", clientName(r), "index", st.index, "reason", reason, "err", err)
	}
}

// parseStreamQuery reads since and heartbeat; false when it answered 400.
func parseStreamQuery(w http.ResponseWriter, r *http.Request) (uint64, time.Duration, bool) {
	q := r.URL.Query()
	for k := range q {
		if k != "since" && k != "heartbeat" {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("unknown query parameter %q (want since, heartbeat)", k))
			return 0, 0, false
		}
	}
	if !q.Has("since") {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "since is required: the index of the last state or changes read")
		return 0, 0, false
	}
	since, err := strconv.ParseUint(q.Get("since"), 10, 64)
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("since=%q: want a non-negative integer", q.Get("since")))
		return 0, 0, false
	}
	hb := api.DefaultStreamHeartbeat
	if v := q.Get("heartbeat"); v != "" {
		if hb, err = time.ParseDuration(v); err != nil || hb < api.MinStreamHeartbeat || hb > api.MaxStreamHeartbeat {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest,
				fmt.Sprintf("heartbeat=%q: want a duration between %s and %s", v, api.MinStreamHeartbeat, api.MaxStreamHeartbeat))
			return 0, 0, false
		}
	}
	return since, hb, true
}

// clientName is the identity a request acts as, for logs.
func clientName(r *http.Request) string {
	if id, ok := requestIdentity(r); ok {
		return id.String()
	}
	return ""
}

// changeStream is one stream being served.
type changeStream struct {
	s    *server
	w    http.ResponseWriter
	r    *http.Request
	rc   *http.ResponseController
	hb   time.Duration
	gzip bool
	// index is what the client holds: the index of the last changes frame.
	index uint64
	// header is the buffer of frame headers, reused.
	header []byte
}

// Reasons a stream ends, for the log.
const (
	streamEndClient  = "the client closed it"
	streamEndWrite   = "a frame write failed (the client did not read for the write timeout, or the connection broke)"
	streamEndGone    = "gone"
	streamEndRevoked = "revoked"
	streamEndStop    = "the master stops"
	streamEndFailed  = "the changes could not be encoded"
)

// streamEndLabel is a reason as carve_master_change_stream_ends_total
// labels it (streamEndLabelValues lists them).
func streamEndLabel(reason string) string {
	switch reason {
	case streamEndClient:
		return "client"
	case streamEndWrite:
		return "write_failed"
	case streamEndGone:
		return "gone"
	case streamEndRevoked:
		return "revoked"
	case streamEndStop:
		return "stop"
	default:
		return "failed"
	}
}

// streamEndLabelValues are streamEndLabel's answers.
func streamEndLabelValues() []string {
	return []string{"client", "write_failed", "gone", "revoked", "stop", "failed"}
}

// run writes frames until the stream ends; it returns why, and an error
// when the end was not an orderly one (a write failed, or an end frame).
func (st *changeStream) run() (string, error) {
	table := st.s.m.table
	heartbeat := time.NewTimer(st.hb)
	defer heartbeat.Stop()
	signing := table.SigningGeneration()
	first := true // the first frame goes out at once: the client learns the master answers
	for {
		ch, cur := table.Changed()
		gen := table.SigningGeneration()
		news := first || cur > st.index || gen != signing || table.AheadOfRestore(st.index)
		if news && !first && cur > st.index {
			// The watchers of a burst are answered together (rounds.go).
			select {
			case <-table.Round(cur):
			case <-st.s.m.runCtx.Done():
				return streamEndStop, st.end(http.StatusServiceUnavailable, api.Error{Code: api.CodeUnavailable,
					Message: "the master stops: open the stream at another master"})
			case <-st.r.Context().Done():
				return streamEndClient, nil
			}
		}
		if news {
			if reason, err := st.changes(); err != nil || reason != "" {
				return reason, err
			}
			first, signing = false, gen
			heartbeat.Reset(st.hb)
			continue
		}
		select {
		case <-ch:
		case <-heartbeat.C:
			if why := st.s.revokedClient(st.r); why != "" {
				return streamEndRevoked, st.end(http.StatusUnauthorized, api.Error{Code: api.CodeRevoked, Message: why})
			}
			if err := st.heartbeat(cur); err != nil {
				return streamEndWrite, err
			}
			heartbeat.Reset(st.hb)
		case <-st.s.m.runCtx.Done():
			return streamEndStop, st.end(http.StatusServiceUnavailable, api.Error{Code: api.CodeUnavailable,
				Message: "the master stops: open the stream at another master"})
		case <-st.r.Context().Done():
			return streamEndClient, nil
		}
	}
}

// changes writes the changes since the stream's index, from the shared
// encoding; a reason when the stream ends.
func (st *changeStream) changes() (string, error) {
	// A revoked certificate gets nothing more: checked before every frame
	// (a revocation is a state change, so every stream wakes for it).
	if why := st.s.revokedClient(st.r); why != "" {
		return streamEndRevoked, st.end(http.StatusUnauthorized, api.Error{Code: api.CodeRevoked, Message: why})
	}
	b, err := st.s.m.table.ChangesBody(st.index)
	var gone *changelog.GoneError
	switch {
	case errors.As(err, &gone):
		return streamEndGone, st.end(http.StatusGone, api.Error{Code: api.CodeGone, Oldest: gone.Oldest,
			Message: fmt.Sprintf("changes since index %d are not kept (the oldest served is %d, after a compaction, a snapshot or a long absence): read the whole state", st.index, gone.Oldest)})
	case err != nil:
		return streamEndFailed, st.end(http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()})
	}
	kind, data := api.FrameChanges, b.Data()
	if st.gzip && len(data) >= gzipMinBytes {
		kind, data = api.FrameChangesGzip, b.Gzipped()
	}
	if err := st.frame(kind, data); err != nil {
		return streamEndWrite, err
	}
	st.index = b.Index()
	return "", nil
}

// heartbeat writes a heartbeat frame with the state's index. An agent's
// stream is also heard from at each (as its long polls are at each
// request: noteHeard), so that an agent that streams from the leader
// counts as live between its usage reports there.
func (st *changeStream) heartbeat(index uint64) error {
	if id, ok := requestIdentity(st.r); ok && id.Role == pki.RoleAgent {
		st.s.m.table.Heard(id.Name, time.Now())
	}
	payload, _ := json.Marshal(api.StreamHeartbeat{Index: index}) // a struct of a number: no error
	return st.frame(api.FrameHeartbeat, payload)
}

// end writes the stream's end frame, e, and returns it as the error (the
// frame's write error when it could not be written). status is what the
// long poll would have answered.
func (st *changeStream) end(status int, e api.Error) error {
	payload, _ := json.Marshal(e) // strings and a number: no error
	if err := st.frame(api.FrameEnd, payload); err != nil {
		return err
	}
	return fmt.Errorf("ended with %s (HTTP %d): %s", e.Code, status, e.Message)
}

// frameChunk is how much of a frame is written within one extension of
// the deadlines. The write timeout bounds how long a client may go
// without reading, not how long a frame takes: a frame of every record is
// tens of MB at 50,000 agents, and an agent that reads it, slower than
// that size within one timeout, was dropped at every attempt when the
// deadline bounded the whole frame. (A TLS record's worth.)
const frameChunk = 16 << 10

// frame writes one frame and flushes it, each frameChunk of it within the
// write timeout.
func (st *changeStream) frame(kind string, payload []byte) error {
	if err := st.extend(); err != nil {
		return err
	}
	st.header = api.AppendFrameHeader(st.header[:0], kind, len(payload))
	if _, err := st.w.Write(st.header); err != nil {
		return fmt.Errorf("write a %s frame: %w", kind, err)
	}
	for len(payload) > 0 {
		n := min(len(payload), frameChunk)
		if _, err := st.w.Write(payload[:n]); err != nil {
			return fmt.Errorf("write a %s frame: %w", kind, err)
		}
		if payload = payload[n:]; len(payload) > 0 {
			if err := st.extend(); err != nil {
				return err
			}
		}
	}
	if err := st.rc.Flush(); err != nil {
		return fmt.Errorf("flush a %s frame: %w", kind, err)
	}
	return nil
}

// extend moves the connection's deadlines past the next frame (or chunk
// of one): the write deadline bounds a write to a client that does not
// read; the read deadline's expiry would cancel the request while the
// stream waits.
func (st *changeStream) extend() error {
	return httpapi.ExtendDeadlines(st.w, st.hb+st.s.streamWriteTimeout())
}

// streamWriteTimeout is Options.StreamWriteTimeout, defaulted.
func (s *server) streamWriteTimeout() time.Duration {
	if d := s.m.opts.StreamWriteTimeout; d > 0 {
		return d
	}
	return DefaultStreamWriteTimeout
}
