//go:build linux

package master

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/changestream"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestChangesStreamDropsAStalledClient: on a secure 3-master cluster, four
// agents stream a follower's changes, each over its own TLS connection;
// one stops reading after the response's headers (a small receive buffer,
// the master's send buffer small too) while agents register one after
// another. The master's write to it blocks; meanwhile the other three get
// every change, those committed after that write began included (no
// head-of-line blocking), and the master ends the stalled stream (its
// handler returns: write_failed, one stream fewer open) once its write
// timeout passed. Reading again, the stalled client gets the frames the
// buffers held; opened again from the index of the last, its stream brings
// it to the state the others hold, which is the master's. No goroutine
// serves a stream once they are closed.
func TestChangesStreamDropsAStalledClient(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	sc := newStreamCluster(t, 3*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := sc.urls()[sc.follower]
	since := sc.masters[sc.follower].table.Index()

	var stalledConn atomic.Pointer[bufferConn]
	var fast []*follower
	for i := range 3 {
		name := fmt.Sprintf("fast-%d", i)
		s, err := sc.streamClient(name, 60+i).StreamChanges(ctx, since, apiclient.StreamOptions{Heartbeat: 5 * time.Second})
		if err != nil {
			t.Fatalf("open %s's stream: %v", name, err)
		}
		fast = append(fast, follow(t, name, s, since, &stalledConn))
	}
	sc.p.IssueAgent("stalled", netip.MustParseAddr("198.18.0.70"))
	stalled := openRawStream(ctx, t, base, sc.p.ClientTLS("stalled", pki.RoleAgent), since, time.Second, nil)
	testutil.Eventually(t, 0, "the master accepted the stalled client's connection", func() error {
		bc, err := sc.lns[sc.follower].conn(stalled.local)
		if err == nil {
			stalledConn.Store(bc)
		}
		return err
	})
	bc := stalledConn.Load()
	testutil.Eventually(t, 0, "the master serves the four streams", func() error {
		if n := sc.openStreams(); n != 4 {
			return fmt.Errorf("%v streams open", n)
		}
		return nil
	})

	// Registrations until the master drops the stalled stream (once its
	// write blocked, its write timeout and TLS's close, up to 5 s more).
	p := sc.push(ctx, "stall", 20000, nil)
	testutil.Eventually(t, 2*time.Minute, "the master drops the stalled stream", func() error {
		err := fmt.Errorf("stalled connection failed %v, %v streams open, %v write_failed ends, %v client ends; %d registrations",
			bc.hasFailed(), sc.openStreams(), sc.streamEnds("write_failed"), sc.streamEnds("client"), p.n.Load())
		select {
		case <-p.done:
			return retry.Permanent(fmt.Errorf("the registrations ended (%v): %w", p.err, err))
		default:
		}
		var ends float64
		for _, reason := range changestream.EndLabels() {
			ends += sc.streamEnds(reason)
		}
		if ends > 0 && sc.streamEnds("write_failed") != ends {
			return retry.Permanent(fmt.Errorf("a stream ended for another reason than a failed write: %w", err))
		}
		if !bc.hasFailed() || sc.openStreams() != 3 || sc.streamEnds("write_failed") != 1 {
			return err
		}
		return nil
	})
	p.stop()
	if p.err != nil {
		t.Fatal(p.err)
	}
	t.Logf("%d registrations until the drop; the failed write began at index %d, failed after %s: %v", p.n.Load(), bc.from, bc.blocked, bc.err)
	if !errors.Is(bc.err, os.ErrDeadlineExceeded) {
		t.Fatalf("the stalled connection's write failed with %v, want its deadline passed", bc.err)
	}

	// Every change reached the other streams, and while the stalled
	// stream's write was blocked they got what was committed after it
	// began.
	sc.waitConverged()
	want := sc.masterView(ctx)
	for _, f := range fast {
		testutil.Eventually(t, 0, f.name+" reads every change", func() error { return f.at(want.index) })
		f.mu.Lock()
		err, beforeDrop := f.view.same(want), f.beforeDrop
		f.mu.Unlock()
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if beforeDrop <= bc.from {
			t.Fatalf("%s read up to index %d before the stalled stream's write failed, which began at %d: nothing committed while the stalled stream was blocked reached it before the master gave up (head-of-line blocking)",
				f.name, beforeDrop, bc.from)
		}
	}

	// The stalled client reads again: the frames the buffers held, then
	// the end of the connection; from the index of the last, a new stream
	// brings it to the same state.
	v := newStreamView(since)
	err := stalled.readAll(v)
	t.Logf("the stalled client read %d frames up to index %d, then %v", v.frames, v.index, err)
	var end *api.Error
	if errors.As(err, &end) || errors.Is(err, api.ErrBadFrame) {
		t.Fatalf("the stalled stream ended with %v, want the connection's end (the master told a client that does not read nothing)", err)
	}
	if v.index >= want.index {
		t.Fatalf("the stalled client read up to index %d, the master's state is at %d: it missed nothing, so it was never stalled", v.index, want.index)
	}
	cl, err := apiclient.NewClient([]string{base}, sc.p.sharedHTTPClient("stalled", pki.RoleAgent))
	if err != nil {
		t.Fatal(err)
	}
	again, err := cl.StreamChanges(ctx, v.index, apiclient.StreamOptions{Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { again.Close() })
	for v.index < want.index {
		ch, err := again.Next()
		if err != nil {
			t.Fatalf("the stalled client's new stream: %v", err)
		}
		if err := v.apply(ch); err != nil {
			t.Fatalf("the stalled client's new stream: %v", err)
		}
	}
	if err := v.same(want); err != nil {
		t.Fatalf("the stalled client after its new stream: %v", err)
	}

	// Nothing is left serving a stream once they are closed.
	again.Close()
	for _, f := range fast {
		f.close()
	}
	testutil.Eventually(t, 0, "no stream left open", func() error {
		if n, g := sc.openStreams(), streamGoroutines(); n != 0 || g != 0 {
			return fmt.Errorf("%v streams open, %d goroutines in changesStream", n, g)
		}
		return nil
	})
}

// TestChangesStreamCoalescesForASlowReader: on a secure 3-master cluster,
// an agent streams a follower's changes at full speed and another reads
// its stream slowly (a small receive buffer, 16 bytes read per
// registration, a fortieth of a registration's record) while 300 agents
// register one after another. The slow stream is not queued: once its
// buffers are full, each frame it gets holds everything since the one
// before, so it reads fewer frames than the fast one (whose frames the
// rounds coalesce too) and than there were changes, none lost, and it is
// not dropped; once it reads at full speed again it ends at the same
// index and state as the fast one, the master's. (With 100 registrations
// and 256 bytes read for each, a quiet machine registered them in rounds
// of ten, and the buffers held all but the last few rounds: both read ten
// frames. With 300 and 64 bytes, rounds of 35-40 registrations, gzip'ed,
// fitted the buffers as well on a machine whose registrations were
// faster: both read 8 or 9 frames in two runs of three. At 16 bytes the
// slow one read 5-7 frames against the fast one's 7-12, quiet and beside
// two busy loops.)
func TestChangesStreamCoalescesForASlowReader(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	sc := newStreamCluster(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	since := sc.masters[sc.follower].table.Index()
	var none atomic.Pointer[bufferConn]

	s, err := sc.streamClient("fast", 60).StreamChanges(ctx, since, apiclient.StreamOptions{Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fast := follow(t, "fast", s, since, &none)
	slowCl, conn := sc.slowClient("slow", 61)
	// The heartbeats are far apart: a frame read slowly may take a while
	// to come whole, and the client drops a stream silent for three.
	s, err = slowCl.StreamChanges(ctx, since, apiclient.StreamOptions{Heartbeat: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	slowConn := conn.Load()
	slowConn.slowed.Store(true)
	slow := follow(t, "slow", s, since, &none)

	const changes = 300
	p := sc.push(ctx, "slow", changes, slowConn.token)
	<-p.done
	if p.err != nil {
		t.Fatal(p.err)
	}
	slowConn.unslow()
	sc.waitConverged()
	want := sc.masterView(ctx)
	frames := map[string]int{}
	for _, f := range []*follower{fast, slow} {
		testutil.Eventually(t, 0, f.name+" reads every change", func() error { return f.at(want.index) })
		f.mu.Lock()
		err := f.view.same(want)
		frames[f.name] = f.view.frames
		f.mu.Unlock()
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	}
	t.Logf("%d changes: the fast reader read %d frames, the slow one %d", changes, frames["fast"], frames["slow"])
	// A stream with a queue would have brought the slow reader every frame
	// the fast one read; the rounds coalesce the fast one's too.
	if frames["slow"] >= frames["fast"] || frames["slow"] >= changes {
		t.Fatalf("the slow reader read %d frames, the fast one %d, for %d changes: want the slow one's coalesced while it fell behind",
			frames["slow"], frames["fast"], changes)
	}
	if n := sc.streamEnds("write_failed"); n != 0 {
		t.Fatalf("%v streams dropped, want none: the slow reader read", n)
	}
}

// TestChangesStreamKeepsASlowLinkReading: a stream's first frame holds
// 400 agents' records (a few hundred KB), to a client over a slow link
// (about 25 KB/s, a small receive buffer) that takes longer than the
// master's write timeout (8 s here: a busy machine may starve the reader
// for a while) to read it, reading all along. The
// write timeout bounds how long a client may go without reading, not how
// long a frame takes: the stream is not dropped, and the client gets the
// frame whole. (A frame of every record is tens of MB at 50,000 agents:
// timed as one write, an agent that reads it slower than that would be
// dropped at every attempt.)
func TestChangesStreamKeepsASlowLinkReading(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	sc := newStreamCluster(t, 8*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	since := sc.masters[sc.follower].table.Index()
	p := sc.push(ctx, "far", 400, nil)
	<-p.done
	if p.err != nil {
		t.Fatal(p.err)
	}
	sc.waitConverged()
	want := sc.masterView(ctx)

	sc.p.IssueAgent("slow-link", netip.MustParseAddr("198.18.0.72"))
	rs := openRawStream(ctx, t, sc.urls()[sc.follower], sc.p.ClientTLS("slow-link", pki.RoleAgent), since, api.MinStreamHeartbeat, newPacedConn)
	counted := &countingReader{r: rs.resp.Body}
	frames := api.NewFrameReader(counted)
	v := newStreamView(since)
	start := time.Now()
	for v.index < want.index {
		fr, err := frames.Next()
		if err != nil {
			t.Fatalf("after %d frames, %d bytes in %s: %v (%v streams dropped)", v.frames, counted.n, time.Since(start), err, sc.streamEnds("write_failed"))
		}
		if fr.Kind == api.FrameEnd {
			t.Fatalf("the stream ended: %v", fr.End)
		}
		if fr.Kind == api.FrameChanges {
			if err := v.apply(fr.Changes); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d frames, %d bytes in %s", v.frames, counted.n, time.Since(start))
	if err := v.same(want); err != nil {
		t.Fatal(err)
	}
	if n := sc.streamEnds("write_failed"); n != 0 {
		t.Fatalf("%v streams dropped, want none", n)
	}
}

// countingReader counts what it reads.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
