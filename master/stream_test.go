package master

import (
	"context"
	"errors"
	"fmt"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestChangesStreamsOnFollowers: on a secure 3-master cluster, an agent's
// changes streams on both followers first say the index they were opened
// at, then carry a registration sent to the leader (signed, verifying,
// alone), then a burst of registrations (gzip'ed frames, more than 8 KB)
// until the streams reach the leader's index with every record; revoking
// the watcher's certificate ends its streams with revoked, and a new one
// is refused; a stream from before the compaction horizon is refused 410
// with the oldest index served.
func TestChangesStreamsOnFollowers(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, state.DefaultConfig(), p, func(o *Options) {
		o.TombstoneMaxAge, o.CompactEvery = 300*time.Millisecond, 50*time.Millisecond
	})
	leader := c.waitLeader()
	c.waitConverged()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := c.clientAs(leader, "op", pki.RoleOperator)
	doomed, err := op.Register(ctx, api.RegisterRequest{AgentID: "doomed", IP: "198.18.0.9"})
	if err != nil {
		t.Fatal(err)
	}
	p.IssueAgent("watcher", netip.MustParseAddr("198.18.0.50"))
	var streams []*apiclient.ChangeStream
	var st *api.State
	for _, f := range []int{(leader + 1) % 3, (leader + 2) % 3} {
		watcher := c.clientAs(f, "watcher", pki.RoleAgent)
		if st, err = watcher.State(ctx, apiclient.StateOptions{Index: doomed.Version - 1, Wait: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
		s, err := watcher.StreamChanges(ctx, st.Index, apiclient.StreamOptions{Heartbeat: 3 * time.Second})
		if err != nil {
			t.Fatalf("open a stream on follower %d: %v", f, err)
		}
		t.Cleanup(func() { s.Close() })
		if s.Master() != c.urls()[f] {
			t.Fatalf("stream served by %s, want the follower %s", s.Master(), c.urls()[f])
		}
		first, err := s.Next()
		if err != nil || first.Index < st.Index || first.Since != st.Index {
			t.Fatalf("first frame %+v (%v): want the changes since %d at once", first, err, st.Index)
		}
		streams = append(streams, s)
	}
	info, err := op.Register(ctx, api.RegisterRequest{AgentID: "newcomer", IP: "198.18.0.10"})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		ch := nextWith(t, s, func(ch *api.Changes) bool { return ch.Index >= info.Version })
		if len(ch.Agents) != 1 || ch.Agents[0].AgentID != "newcomer" || ch.Network != nil {
			t.Fatalf("stream %d: changes %+v, want newcomer alone", i, ch)
		}
		key, err := api.ParseSigningKey(ch.SigningKey)
		if err != nil || ch.ClusterID != st.ClusterID {
			t.Fatalf("stream %d: signing key %q (%v), cluster %q want %q", i, ch.SigningKey, err, ch.ClusterID, st.ClusterID)
		}
		if err := api.VerifyRecord(key, &ch.Agents[0], ch.ClusterID); err != nil {
			t.Fatalf("stream %d: newcomer's record: %v", i, err)
		}
	}

	// A burst: the frames together hold every record, up to the leader's index.
	const burst = 20
	errs := make(chan error, burst)
	for i := range burst {
		go func() {
			_, err := registerRetrying(ctx, op, api.RegisterRequest{AgentID: fmt.Sprintf("burst-%d", i), IP: fmt.Sprintf("198.18.1.%d", i+1)})
			errs <- err
		}()
	}
	for range burst {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	last := c.masters[leader].table.Index()
	for i, s := range streams {
		seen := map[string]bool{}
		nextWith(t, s, func(ch *api.Changes) bool {
			for _, a := range ch.Agents {
				seen[a.AgentID] = true
			}
			return ch.Index >= last
		})
		for j := range burst {
			if id := fmt.Sprintf("burst-%d", j); !seen[id] {
				t.Fatalf("stream %d reached index %d without %s", i, last, id)
			}
		}
	}

	// Revoked: the open streams end, a new one is refused.
	cert, err := pki.ReadCertificate(p.Files("watcher", pki.RoleAgent).Cert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := retrying(ctx, func() (*api.Revocations, error) {
		return op.Revoke(ctx, api.RevokeRequest{Serial: pki.Serial(cert), Identity: "agent/watcher", NotAfter: cert.NotAfter.Unix()})
	}); err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		for {
			_, err := s.Next()
			if err == nil {
				continue // a frame written before the revocation was applied there
			}
			if !api.IsCode(err, api.CodeRevoked) || api.IsRetryable(err) {
				t.Fatalf("stream %d after the revocation: %v, want the end frame revoked", i, err)
			}
			break
		}
	}
	// The operator sees the streams end, as revoked, and none left open.
	testutil.Eventually(t, 0, "the masters count the streams' ends", func() error {
		var open, revoked float64
		for _, m := range c.running() {
			open += promtestutil.ToFloat64(m.metrics.streams)
			revoked += promtestutil.ToFloat64(m.metrics.streamEnds.WithLabelValues("revoked"))
		}
		if open != 0 || revoked != float64(len(streams)) {
			return fmt.Errorf("carve_master_change_streams %v, revoked ends %v; want 0 and %d", open, revoked, len(streams))
		}
		return nil
	})
	watcher := c.clientAs((leader+1)%3, "watcher", pki.RoleAgent)
	testutil.Eventually(t, 0, "a new stream of the revoked watcher is refused", func() error {
		s, err := watcher.StreamChanges(ctx, 0, apiclient.StreamOptions{})
		if err == nil {
			s.Close()
			return errors.New("opened")
		}
		if !api.IsCode(err, api.CodeRevoked) {
			return err
		}
		return nil
	})

	// Before the horizon: 410 before the stream begins.
	if err := op.DeleteAgent(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	tomb, _ := c.masters[leader].table.Tombstone("doomed")
	for _, m := range c.running() {
		testutil.Eventually(t, 0, m.opts.ID+" compacts doomed's tombstone", func() error {
			if _, ok := m.table.Tombstone("doomed"); ok || m.table.Horizon() < tomb {
				return fmt.Errorf("horizon %d, tombstone at %d", m.table.Horizon(), tomb)
			}
			return nil
		})
	}
	_, err = c.clientAs((leader+1)%3, "late", pki.RoleAgent).StreamChanges(ctx, st.Index, apiclient.StreamOptions{})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusGone || apiErr.Code != api.CodeGone || apiErr.Oldest < tomb {
		t.Fatalf("stream since %d after the horizon passed %d: %v, want 410 gone with the oldest index", st.Index, tomb, err)
	}

}

// nextWith reads the stream's frames until one satisfies done and returns it.
func nextWith(t *testing.T, s *apiclient.ChangeStream, done func(*api.Changes) bool) *api.Changes {
	t.Helper()
	for {
		ch, err := s.Next()
		if err != nil {
			t.Fatalf("stream of %s: %v", s.Master(), err)
		}
		if done(ch) {
			return ch
		}
	}
}

// TestChangesStreamRefusesBadQueries: what the stream cannot follow is a
// 400 naming the parameter, before any frame.
func TestChangesStreamRefusesBadQueries(t *testing.T) {
	c := newTestCluster(t, 1, state.DefaultConfig())
	c.waitLeader()
	base := c.urls()[0] + api.StreamPath
	tests := []struct{ query, want string }{
		{"", "since is required"},
		{"?since=x", "since="},
		{"?since=1&wait=3s", "unknown query parameter"},
		{"?since=1&heartbeat=1ms", "heartbeat="},
		{"?since=1&heartbeat=1h", "heartbeat="},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			status, _, body := httpCall(t, http.MethodGet, base+tt.query, "", nil)
			if status != http.StatusBadRequest || !strings.Contains(string(body), tt.want) {
				t.Fatalf("GET %s: %d %s, want 400 naming %q", tt.query, status, body, tt.want)
			}
		})
	}
}

// failingWriter is a ResponseWriter whose writes fail from the
// failFrom'th on, as a write to a client that stopped reading does once
// its deadline passed.
type failingWriter struct {
	header   http.Header
	status   int
	mu       sync.Mutex
	writes   int
	failFrom int
}

func (w *failingWriter) Header() http.Header    { return w.header }
func (w *failingWriter) WriteHeader(status int) { w.status = status }
func (w *failingWriter) Flush()                 {}
func (w *failingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	if w.writes >= w.failFrom {
		return 0, os.ErrDeadlineExceeded
	}
	return len(p), nil
}

// TestChangesStreamEndsOnAFailedWrite: a stream whose frame cannot be
// written (its client did not read until the write deadline) ends there:
// its handler returns, holding nothing, and writes nothing more, rather
// than queueing the frames its client does not take.
func TestChangesStreamEndsOnAFailedWrite(t *testing.T) {
	c := newTestCluster(t, 1, state.DefaultConfig())
	c.waitLeader()
	c.waitConverged()
	s := &server{m: c.masters[0], log: testLogger(t)}
	// The first frame (its header and payload) goes out; the first
	// heartbeat's header fails.
	w := &failingWriter{header: http.Header{}, failFrom: 3}
	r := httptest.NewRequest(http.MethodGet, api.StreamPath+"?since=0&heartbeat=100ms", nil)
	var done atomic.Bool
	go func() {
		s.changesStream(w, r)
		done.Store(true)
	}()
	testutil.Eventually(t, 0, "the stream ends at its failed write", testutil.True(done.Load))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status != http.StatusOK || w.writes != 3 {
		t.Fatalf("status %d, %d writes: want 200, the first frame and one failed write", w.status, w.writes)
	}
}

// flushFailingWriter is a ResponseWriter whose writes go into its
// buffer and whose every flush fails, as the flush of a frame to a client
// that stopped reading does once the write deadline passed (the
// connection's buffered writer holds what the frame's writes put in it).
type flushFailingWriter struct {
	header  http.Header
	mu      sync.Mutex
	flushes int
}

func (w *flushFailingWriter) Header() http.Header         { return w.header }
func (w *flushFailingWriter) WriteHeader(int)             {}
func (w *flushFailingWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *flushFailingWriter) Flush()                      { _ = w.FlushError() }
func (w *flushFailingWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushes++
	return os.ErrDeadlineExceeded
}

// TestChangesStreamEndsOnAFailedFlush: behind the master's request
// counting (instrument, which wraps every answer's ResponseWriter), a
// frame whose flush fails ends the stream there, counted write_failed.
// The wrapper used to pass the flush on but drop its error: the stream
// took the frame for written and went on, and ended only when the
// connection's context was cancelled, counted as its client's doing
// (client) and not logged as a drop; with this fake writer, never.
func TestChangesStreamEndsOnAFailedFlush(t *testing.T) {
	c := newTestCluster(t, 1, state.DefaultConfig())
	c.waitLeader()
	c.waitConverged()
	m := c.masters[0]
	s := &server{m: m, log: testLogger(t)}
	w := &flushFailingWriter{header: http.Header{}}
	r := httptest.NewRequest(http.MethodGet, api.StreamPath+"?since=0&heartbeat=100ms", nil)
	var done atomic.Bool
	go func() {
		s.instrument(http.HandlerFunc(s.changesStream)).ServeHTTP(w, r)
		done.Store(true)
	}()
	testutil.Eventually(t, 0, "the stream ends at its failed flush", testutil.True(done.Load))
	ends := promtestutil.ToFloat64(m.metrics.streamEnds.WithLabelValues("write_failed"))
	w.mu.Lock()
	defer w.mu.Unlock()
	if ends != 1 || w.flushes != 1 {
		t.Fatalf("%v write_failed ends after %d flushes: want 1 after the first frame's", ends, w.flushes)
	}
}
