// Package changestream serves the masters' changes stream, GET
// /overlay-master/changes/stream?since=N: one long request per agent that
// the master writes each change to as a frame (api/stream.go), with
// heartbeats between them, until it ends with an end frame or a failed
// write. It reads the lease table through Table and the request's identity
// and revocation through Server's functions; the master checks, before it
// hands a request over, that it may serve the state and that the changes
// since the request's index are kept.
//
// The long poll (changes, master/reads.go) costs every watcher, at every
// change, a request: its TLS record, header parse, routing, authentication
// and a new answer on the master, a new request on the agent. A stream is
// one request per agent for as long as it lives: the master writes each
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
package changestream

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
)

// DefaultWriteTimeout is Server.WriteTimeout's default: it bounds, past
// the heartbeat, the write of each frameChunk of a frame: a client that
// does not read for that long (its socket buffers full) is dropped.
const DefaultWriteTimeout = 15 * time.Second

// contentType names the frames' format (api/stream.go).
const contentType = "application/x-carve-changes-stream"

// Table is what a stream reads of the lease table (state.LeaseTable).
type Table interface {
	// Changed is a channel closed at the next change, and the index now.
	Changed() (<-chan struct{}, uint64)
	// SigningGeneration changes when the record-signing key does.
	SigningGeneration() uint64
	// AheadOfRestore tells whether index is past the table's last restore.
	AheadOfRestore(index uint64) bool
	// Round is the ticket of the round that holds index: its channel is
	// closed when its watchers are to be answered; Done once answered.
	Round(index uint64) state.RoundTicket
	// ChangesBody is the shared encoding of the changes since an index
	// (a *changelog.GoneError when they are not kept).
	ChangesBody(since uint64) (*state.StateBody, error)
	// Heard notes that an agent was heard from.
	Heard(id string, now time.Time)
}

// Server serves the changes streams of one master. Its fields are set
// before the first Serve and not changed after.
type Server struct {
	// Table is the lease table the streams read.
	Table Table
	// Identity is the identity a request acts as, false when the master
	// runs --insecure.
	Identity func(*http.Request) (pki.Identity, bool)
	// Revoked says why the request's own certificate is refused, "" when
	// it is not revoked.
	Revoked func(*http.Request) string
	// Stop is closed when the master stops: its streams end.
	Stop <-chan struct{}
	// WriteTimeout is how long past its heartbeat a stream may go without
	// its client reading (DefaultWriteTimeout when 0).
	WriteTimeout time.Duration
	// GzipMinBytes is the smallest frame gzip'ed for a client that
	// accepts it.
	GzipMinBytes int
	// Log says which streams were dropped, and why the others ended.
	Log *slog.Logger
	// Open counts the streams served now; Ends those ended, by
	// EndLabels' reason.
	Open prometheus.Gauge
	Ends *prometheus.CounterVec
}

// Query is what a stream request asks for.
type Query struct {
	// Since is the index of the last state or changes the client read.
	Since uint64
	// Heartbeat is how often a heartbeat frame goes out between changes.
	Heartbeat time.Duration
	// Gzip tells that the client accepts gzip'ed frames.
	Gzip bool
}

// ParseQuery reads since and heartbeat; false when it answered 400.
func ParseQuery(w http.ResponseWriter, r *http.Request) (Query, bool) {
	q := r.URL.Query()
	for k := range q {
		if k != "since" && k != "heartbeat" {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("unknown query parameter %q (want since, heartbeat)", k))
			return Query{}, false
		}
	}
	if !q.Has("since") {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "since is required: the index of the last state or changes read")
		return Query{}, false
	}
	since, err := strconv.ParseUint(q.Get("since"), 10, 64)
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("since=%q: want a non-negative integer", q.Get("since")))
		return Query{}, false
	}
	hb := api.DefaultStreamHeartbeat
	if v := q.Get("heartbeat"); v != "" {
		if hb, err = time.ParseDuration(v); err != nil || hb < api.MinStreamHeartbeat || hb > api.MaxStreamHeartbeat {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest,
				fmt.Sprintf("heartbeat=%q: want a duration between %s and %s", v, api.MinStreamHeartbeat, api.MaxStreamHeartbeat))
			return Query{}, false
		}
	}
	return Query{Since: since, Heartbeat: hb}, true
}

// Serve serves the stream q asks for until it ends.
func (s *Server) Serve(w http.ResponseWriter, r *http.Request, q Query) {
	st := &stream{s: s, w: w, r: r, rc: http.NewResponseController(w), hb: q.Heartbeat, gzip: q.Gzip, index: q.Since}
	if err := st.extend(); err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Sprintf("extend the stream's deadlines: %v", err))
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	// A stream ends rarely (a revocation, a 410, a drop): its connection
	// is not kept for another request, so that one whose certificate was
	// revoked is not reused either.
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusOK)
	s.Open.Inc()
	reason, err := st.run()
	s.Open.Dec()
	s.Ends.WithLabelValues(endLabel(reason)).Inc()
	switch {
	case reason == endWrite:
		// The one end the client is not told of: said where the
		// operator looks.
		s.Log.Info("dropped a changes stream", "remote", r.RemoteAddr, "client", s.clientName(r), "index", st.index, "reason", reason, "err", err)
	case err != nil:
		// An end frame told the client why (a master stopping ends
		// thousands at once).
		s.Log.Debug("ended a changes stream", "remote", r.RemoteAddr, "client", s.clientName(r), "index", st.index, "reason", reason, "err", err)
	}
}

// clientName is the identity a request acts as, for logs.
func (s *Server) clientName(r *http.Request) string {
	if id, ok := s.Identity(r); ok {
		return id.String()
	}
	return ""
}

// stream is one stream being served.
type stream struct {
	s    *Server
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
	endClient  = "the client closed it"
	endWrite   = "a frame write failed (the client did not read for the write timeout, or the connection broke)"
	endGone    = "gone"
	endRevoked = "revoked"
	endStop    = "the master stops"
	endFailed  = "the changes could not be encoded"
)

// endLabel is a reason as carve_master_change_stream_ends_total labels it
// (EndLabels lists them).
func endLabel(reason string) string {
	switch reason {
	case endClient:
		return "client"
	case endWrite:
		return "write_failed"
	case endGone:
		return "gone"
	case endRevoked:
		return "revoked"
	case endStop:
		return "stop"
	default:
		return "failed"
	}
}

// EndLabels are the reasons Server.Ends counts a stream's end by.
func EndLabels() []string {
	return []string{"client", "write_failed", "gone", "revoked", "stop", "failed"}
}

// run writes frames until the stream ends; it returns why, and an error
// when the end was not an orderly one (a write failed, or an end frame).
func (st *stream) run() (string, error) {
	table := st.s.Table
	heartbeat := time.NewTimer(st.hb)
	defer heartbeat.Stop()
	signing := table.SigningGeneration()
	first := true // the first frame goes out at once: the client learns the master answers
	for {
		ch, cur := table.Changed()
		gen := table.SigningGeneration()
		news := first || cur > st.index || gen != signing || table.AheadOfRestore(st.index)
		var round state.RoundTicket // the zero ticket's Done does nothing
		if news && !first && cur > st.index {
			// The watchers of a burst are answered together, and the next
			// round waits for this one's frames (master/state/rounds.go).
			round = table.Round(cur)
			select {
			case <-round.C:
			case <-st.s.Stop:
				round.Done()
				return endStop, st.end(http.StatusServiceUnavailable, api.Error{Code: api.CodeUnavailable,
					Message: "the master stops: open the stream at another master"})
			case <-st.r.Context().Done():
				round.Done()
				return endClient, nil
			}
		}
		if news {
			reason, err := st.changes()
			round.Done()
			if err != nil || reason != "" {
				return reason, err
			}
			first, signing = false, gen
			heartbeat.Reset(st.hb)
			continue
		}
		select {
		case <-ch:
		case <-heartbeat.C:
			if why := st.s.Revoked(st.r); why != "" {
				return endRevoked, st.end(http.StatusUnauthorized, api.Error{Code: api.CodeRevoked, Message: why})
			}
			if err := st.heartbeat(cur); err != nil {
				return endWrite, err
			}
			heartbeat.Reset(st.hb)
		case <-st.s.Stop:
			return endStop, st.end(http.StatusServiceUnavailable, api.Error{Code: api.CodeUnavailable,
				Message: "the master stops: open the stream at another master"})
		case <-st.r.Context().Done():
			return endClient, nil
		}
	}
}

// changes writes the changes since the stream's index, from the shared
// encoding; a reason when the stream ends.
func (st *stream) changes() (string, error) {
	// A revoked certificate gets nothing more: checked before every frame
	// (a revocation is a state change, so every stream wakes for it).
	if why := st.s.Revoked(st.r); why != "" {
		return endRevoked, st.end(http.StatusUnauthorized, api.Error{Code: api.CodeRevoked, Message: why})
	}
	b, err := st.s.Table.ChangesBody(st.index)
	var gone *changelog.GoneError
	switch {
	case errors.As(err, &gone):
		return endGone, st.end(http.StatusGone, api.Error{Code: api.CodeGone, Oldest: gone.Oldest,
			Message: fmt.Sprintf("changes since index %d are not kept (the oldest served is %d, after a compaction, a snapshot or a long absence): read the whole state", st.index, gone.Oldest)})
	case err != nil:
		return endFailed, st.end(http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()})
	}
	kind, data := api.FrameChanges, b.Data()
	if st.gzip && len(data) >= st.s.GzipMinBytes {
		kind, data = api.FrameChangesGzip, b.Gzipped()
	}
	if err := st.frame(kind, data); err != nil {
		return endWrite, err
	}
	st.index = b.Index()
	return "", nil
}

// heartbeat writes a heartbeat frame with the state's index. An agent's
// stream is also heard from at each (as its long polls are at each
// request: the master's noteHeard), so that an agent that streams from
// the leader counts as live between its usage reports there.
func (st *stream) heartbeat(index uint64) error {
	if id, ok := st.s.Identity(st.r); ok && id.Role == pki.RoleAgent {
		st.s.Table.Heard(id.Name, time.Now())
	}
	payload, _ := json.Marshal(api.StreamHeartbeat{Index: index}) // a struct of a number: no error
	return st.frame(api.FrameHeartbeat, payload)
}

// end writes the stream's end frame, e, and returns it as the error (the
// frame's write error when it could not be written). status is what the
// long poll would have answered.
func (st *stream) end(status int, e api.Error) error {
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
func (st *stream) frame(kind string, payload []byte) error {
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
func (st *stream) extend() error {
	return httpapi.ExtendDeadlines(st.w, st.hb+st.s.writeTimeout())
}

// writeTimeout is WriteTimeout, defaulted.
func (s *Server) writeTimeout() time.Duration {
	if s.WriteTimeout > 0 {
		return s.WriteTimeout
	}
	return DefaultWriteTimeout
}
