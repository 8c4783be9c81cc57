package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/carve-net/carve/api"
)

// ErrStreamUnsupported marks a master (or a proxy before it) without the
// changes stream (404: a master of a release before it): watch with the
// long poll (Client.Changes) instead.
var ErrStreamUnsupported = errors.New("the master serves no changes stream")

// ErrStreamIdle marks a stream on which nothing came for longer than its
// heartbeats allow: the connection or the master is dead.
var ErrStreamIdle = errors.New("nothing on the changes stream for longer than its heartbeats allow")

// ErrStreamEnded marks a stream the master closed without an end frame
// (it dropped a stream that did not keep up, or it stopped): open it again
// from the index last applied.
var ErrStreamEnded = errors.New("the master closed the changes stream")

// StreamOptions configure Client.StreamChanges.
type StreamOptions struct {
	// Heartbeat is how often the master is asked to send a heartbeat when
	// nothing changes (0: api.DefaultStreamHeartbeat). The stream is dropped
	// (ErrStreamIdle) when nothing came for three of them: a frame still
	// coming, however slowly, keeps it.
	Heartbeat time.Duration
}

// ChangeStream is an open changes stream of one master: Next returns each
// changes frame as it comes. Not safe for concurrent use; Close it.
type ChangeStream struct {
	master string
	ctx    context.Context
	cancel context.CancelCauseFunc
	resp   *http.Response
	frames *api.FrameReader
	idle   *time.Timer
}

// StreamChanges opens a changes stream after index since (GET
// /overlay-master/changes/stream): the master sends what changed after
// since at once (nothing, at since's index, when nothing did), then each
// change as it comes, as Changes (signed records, as the long poll's), and
// heartbeats between. It tries the masters as every call does. A master
// without the stream fails with an error wrapping ErrStreamUnsupported;
// since older than the masters keep fails with api.CodeGone, as Changes does.
// ctx bounds the whole stream.
func (c *Client) StreamChanges(ctx context.Context, since uint64, opts StreamOptions) (*ChangeStream, error) {
	hb := opts.Heartbeat
	if hb <= 0 {
		hb = api.DefaultStreamHeartbeat
	}
	q := url.Values{}
	q.Set("since", strconv.FormatUint(since, 10))
	q.Set("heartbeat", hb.String())
	path := api.StreamPath + "?" + q.Encode()
	start := int(c.preferred.Load())
	var failed []masterError
	unsupported := false
	for i := range c.masters {
		idx := (start + i) % len(c.masters)
		s, err := c.openStream(ctx, c.masters[idx], path, hb)
		if err == nil {
			c.preferred.Store(int32(idx))
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("GET %s: %w", api.StreamPath, ctx.Err())
		}
		var e *api.Error
		notFound := errors.As(err, &e) && (e.Status == http.StatusNotFound || e.Status == http.StatusMethodNotAllowed)
		if !notFound && !api.IsRetryable(err) {
			c.preferred.Store(int32(idx))
			return nil, err
		}
		unsupported = unsupported || notFound
		failed = append(failed, masterError{url: c.masters[idx], err: err})
	}
	err := everyMasterFailed(failed)
	if unsupported {
		return nil, fmt.Errorf("%w: %w", ErrStreamUnsupported, err)
	}
	return nil, err
}

// openStream sends the stream's request to one master and returns the
// stream once the master answered 200.
func (c *Client) openStream(ctx context.Context, base, path string, hb time.Duration) (*ChangeStream, error) {
	sctx, cancel := context.WithCancelCause(ctx)
	idleAfter := 3 * hb
	idle := time.AfterFunc(idleAfter, func() { cancel(ErrStreamIdle) })
	fail := func(err error) (*ChangeStream, error) {
		idle.Stop()
		cancel(context.Canceled)
		return nil, err
	}
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, base+path, nil)
	if err != nil {
		return fail(fmt.Errorf("build request GET %s: %w", base+path, err))
	}
	// The stream outlives any per-request timeout of the client: its
	// heartbeats tell a dead master instead.
	hc := *c.http
	hc.Timeout = 0
	resp, err := hc.Do(req)
	if err != nil {
		if cause := context.Cause(sctx); errors.Is(cause, ErrStreamIdle) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return fail(api.NoAnswerError(http.MethodGet, base+path, err))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return fail(api.AnswerError(http.MethodGet, base+path, resp))
	}
	body := &activeReader{r: resp.Body, idle: idle, after: idleAfter}
	return &ChangeStream{master: base, ctx: sctx, cancel: cancel, resp: resp, frames: api.NewFrameReader(body), idle: idle}, nil
}

// activeReader reads a stream's body, putting off its idle timer at every
// byte that comes: what is idle is a stream on which nothing comes, not
// one whose frame is still coming (a frame of every record is tens of MB
// at 50,000 agents, which a slow link takes longer than three heartbeats
// to bring: timed per frame, it was dropped at every attempt).
type activeReader struct {
	r     io.Reader
	idle  *time.Timer
	after time.Duration
}

func (a *activeReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.idle.Reset(a.after)
	}
	return n, err
}

// Master is the base URL of the master that serves the stream.
func (s *ChangeStream) Master() string { return s.master }

// Next returns the next changes frame, reading the heartbeats before it.
// The stream's end is an error: the master's end frame as an *api.Error
// (with the code and the HTTP status a request would have had: CodeGone
// with Oldest, CodeRevoked, CodeNoLeader...), ErrStreamEnded when it closed
// without one, ErrStreamIdle when it went silent, api.ErrBadFrame for what
// is not a frame.
func (s *ChangeStream) Next() (*api.Changes, error) {
	for {
		fr, err := s.frames.Next()
		if err != nil {
			if cause := context.Cause(s.ctx); s.ctx.Err() != nil {
				return nil, api.UnreachableError(fmt.Sprintf("changes stream of %s: %v", s.master, cause), cause)
			}
			if errors.Is(err, api.ErrBadFrame) {
				return nil, fmt.Errorf("changes stream of %s: %w", s.master, err)
			}
			return nil, api.UnreachableError(fmt.Sprintf("changes stream of %s: %v", s.master, err), fmt.Errorf("%w: %w", ErrStreamEnded, err))
		}
		switch fr.Kind {
		case api.FrameHeartbeat:
			continue
		case api.FrameEnd:
			e := *fr.End
			e.Status = streamEndStatus(e.Code)
			e.Message = fmt.Sprintf("changes stream of %s ended: %s", s.master, e.Message)
			return nil, &e
		}
		return fr.Changes, nil
	}
}

// Close ends the stream and releases its connection.
func (s *ChangeStream) Close() error {
	s.idle.Stop()
	s.cancel(context.Canceled)
	return s.resp.Body.Close()
}

// streamEndStatus is the HTTP status an end frame's code stands for (what
// the long poll would have answered), so that api.IsRetryable judges both
// alike.
func streamEndStatus(code string) int {
	switch code {
	case api.CodeGone:
		return http.StatusGone
	case api.CodeRevoked, api.CodeUnauthenticated:
		return http.StatusUnauthorized
	case api.CodeForbidden:
		return http.StatusForbidden
	case api.CodeBadRequest:
		return http.StatusBadRequest
	case api.CodeNoLeader, api.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
