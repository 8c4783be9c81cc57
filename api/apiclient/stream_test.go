package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
)

// TestChangeStreamKeepsAFrameThatComesSlowly: a frame whose bytes come
// over a slow link, taking longer than the three heartbeats after which a
// silent stream is dropped but never silent that long, is read whole:
// what is idle is a stream on which nothing comes, not one whose frame is
// still coming (a frame of every record is tens of MB at 50,000 agents).
// A stream on which nothing comes after the first frame is still dropped
// as idle.
func TestChangeStreamKeepsAFrameThatComesSlowly(t *testing.T) {
	const hb = time.Second
	payload, err := json.Marshal(api.Changes{Index: 9, Since: 1, Agents: []api.AgentInfo{{AgentID: "a1", Hostname: strings.Repeat("h", 2000)}}})
	if err != nil {
		t.Fatal(err)
	}
	frame := api.AppendFrame(nil, api.FrameChanges, payload)
	const pieces = 40
	pace := 4 * hb / pieces // the frame takes four heartbeats to come whole
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		w.WriteHeader(http.StatusOK)
		if err := rc.Flush(); err != nil {
			return
		}
		for rest := frame; len(rest) > 0; {
			n := min(len(rest), len(frame)/pieces+1)
			if _, err := w.Write(rest[:n]); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			rest = rest[n:]
			// A slow link: the bytes come at this pace (not a wait
			// for a condition).
			select {
			case <-time.After(pace):
			case <-r.Context().Done():
				return
			}
		}
		<-r.Context().Done() // then nothing: the stream goes silent
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient([]string{srv.URL}, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.StreamChanges(context.Background(), 1, StreamOptions{Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ch, err := s.Next()
	if err != nil {
		t.Fatalf("a frame that came slowly: %v, want it whole", err)
	}
	if ch.Index != 9 || len(ch.Agents) != 1 || ch.Agents[0].AgentID != "a1" {
		t.Fatalf("frame %+v", ch)
	}
	if _, err := s.Next(); !errors.Is(err, ErrStreamIdle) {
		t.Fatalf("after the frame, nothing: %v, want ErrStreamIdle", err)
	}
}

// TestChangeStreamEnds: each way a stream ends is the error its callers
// branch on, through the wrapping api.UnreachableError and api.Error do
// for this package: a stream closed without an end frame wraps both
// ErrStreamEnded and api.ErrUnreachable (retried), an end frame is the
// *api.Error of its code with the status a request would have had, and
// what is not a frame wraps api.ErrBadFrame.
func TestChangeStreamEnds(t *testing.T) {
	changes, err := json.Marshal(api.Changes{Index: 2, Since: 1})
	if err != nil {
		t.Fatal(err)
	}
	end, err := json.Marshal(api.Error{Message: "too old", Code: api.CodeGone, Oldest: 5})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		after     []byte // what the master sends after a first changes frame
		is        []error
		retryable bool
		status    int
	}{
		{"closed without an end frame", nil, []error{ErrStreamEnded, api.ErrUnreachable}, true, 0},
		{"end frame", api.AppendFrame(nil, api.FrameEnd, end), nil, false, http.StatusGone},
		{"not a frame", []byte("garbage\n"), []error{api.ErrBadFrame}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write(api.AppendFrame(nil, api.FrameChanges, changes))
				_, _ = w.Write(tt.after)
			}))
			t.Cleanup(srv.Close)
			c, err := NewClient([]string{srv.URL}, srv.Client())
			if err != nil {
				t.Fatal(err)
			}
			s, err := c.StreamChanges(context.Background(), 1, StreamOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if ch, err := s.Next(); err != nil || ch.Index != 2 {
				t.Fatalf("first frame: %+v, %v", ch, err)
			}
			_, err = s.Next()
			for _, want := range tt.is {
				if !errors.Is(err, want) {
					t.Errorf("%v: want it to wrap %v", err, want)
				}
			}
			if got := api.IsRetryable(err); got != tt.retryable {
				t.Errorf("%v: IsRetryable %v, want %v", err, got, tt.retryable)
			}
			var e *api.Error
			if tt.status != 0 && (!errors.As(err, &e) || e.Status != tt.status || e.Oldest != 5) {
				t.Errorf("%v: want an *api.Error with status %d and Oldest 5", err, tt.status)
			}
		})
	}
}
