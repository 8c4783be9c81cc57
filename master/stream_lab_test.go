//go:build linux

package master

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
)

// The harness of the changes stream's tests with real clients over real
// TLS connections to a real cluster (stream_stall_test.go): clients that
// stop reading, or read slowly. The kernel's buffers are made small (the
// masters' send buffers, the slow clients' receive buffers) so that a few
// frames fill them.

// streamTestBuffer is the socket buffer size asked of the kernel (it
// doubles it) on both ends of the slow clients' connections.
const streamTestBuffer = 4096

// bufferListener is a master's API listener whose connections have small
// send buffers, and whose writes are watched (bufferConn).
type bufferListener struct {
	net.Listener
	// table is the master's, once it started: the index a write began at.
	table atomic.Pointer[state.LeaseTable]
	mu    sync.Mutex
	conns map[string]*bufferConn // by the client's address
	err   error                  // a send buffer that could not be set
}

func (l *bufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	bc := &bufferConn{Conn: c, table: &l.table, failed: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetWriteBuffer(streamTestBuffer); err != nil && l.err == nil {
			l.err = fmt.Errorf("set the send buffer of %s: %w", c.RemoteAddr(), err)
		}
	}
	l.conns[c.RemoteAddr().String()] = bc
	return bc, nil
}

// conn is the master's end of the connection from the client address
// remote, once accepted.
func (l *bufferListener) conn(remote string) (*bufferConn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, l.err
	}
	bc, ok := l.conns[remote]
	if !ok {
		return nil, fmt.Errorf("no connection from %s accepted yet", remote)
	}
	return bc, nil
}

// bufferConn is a master's end of a connection: it notes the first write
// that failed, and the state index when that write began.
type bufferConn struct {
	net.Conn
	table *atomic.Pointer[state.LeaseTable]
	once  sync.Once
	// failed is closed at the first failed write; from is the state index
	// when it began, err its error.
	failed chan struct{}
	from   uint64
	err    error
	// blocked is how long the failed write took, for the log.
	blocked time.Duration
}

func (c *bufferConn) Write(p []byte) (int, error) {
	var from uint64
	if t := c.table.Load(); t != nil {
		from = t.Index()
	}
	began := time.Now()
	n, err := c.Conn.Write(p)
	if err != nil {
		c.once.Do(func() {
			c.from, c.err, c.blocked = from, err, time.Since(began)
			close(c.failed)
		})
	}
	return n, err
}

// hasFailed tells whether a write on the connection failed yet.
func (c *bufferConn) hasFailed() bool {
	select {
	case <-c.failed:
		return true
	default:
		return false
	}
}

// streamCluster is a secure 3-master cluster whose API listeners are
// bufferListeners, with the streams served by one follower.
type streamCluster struct {
	*testCluster
	p        *testPKI
	lns      []*bufferListener
	leader   int
	follower int // the master the streams are opened at
	op       *apiclient.Client
}

func newStreamCluster(t *testing.T, writeTimeout time.Duration) *streamCluster {
	t.Helper()
	sc := &streamCluster{p: newTestPKI(t)}
	var mu sync.Mutex
	byID := map[string]*bufferListener{}
	c := newTestClusterWith(t, 3, state.DefaultConfig(), sc.p, func(o *Options) {
		o.StreamWriteTimeout = writeTimeout
		mu.Lock()
		defer mu.Unlock()
		if byID[o.ID] != nil {
			o.HTTPListener = byID[o.ID]
			return
		}
		ln, err := net.Listen("tcp", o.HTTPAddr)
		if err != nil {
			t.Fatalf("listen on %s: %v", o.HTTPAddr, err)
		}
		byID[o.ID] = &bufferListener{Listener: ln, conns: map[string]*bufferConn{}}
		o.HTTPListener = byID[o.ID]
	})
	sc.testCluster = c
	for i, id := range c.ids {
		byID[id].table.Store(c.masters[i].table)
		sc.lns = append(sc.lns, byID[id])
	}
	sc.leader = c.waitLeader()
	c.waitConverged()
	sc.follower = (sc.leader + 1) % 3
	sc.op = c.clientAs(sc.leader, "op", pki.RoleOperator)
	return sc
}

// streamClient is an agent's client of the streams' master alone, on
// connections of its own.
func (sc *streamCluster) streamClient(name string, ip int) *apiclient.Client {
	sc.t.Helper()
	sc.p.IssueAgent(name, netip.AddrFrom4([4]byte{198, 18, 0, byte(ip)}))
	cl, err := apiclient.NewClient([]string{sc.urls()[sc.follower]}, sc.p.sharedHTTPClient(name, pki.RoleAgent))
	if err != nil {
		sc.t.Fatal(err)
	}
	return cl
}

// streamEnds is how many streams the streams' master ended with reason.
func (sc *streamCluster) streamEnds(reason string) float64 {
	return promtestutil.ToFloat64(sc.masters[sc.follower].metrics.streamEnds.WithLabelValues(reason))
}

// openStreams is how many streams the streams' master serves now.
func (sc *streamCluster) openStreams() float64 {
	return promtestutil.ToFloat64(sc.masters[sc.follower].metrics.streams)
}

// pusher registers agents one after another, from its own goroutine,
// until stopped: each registration is a change every stream carries.
type pusher struct {
	stopping atomic.Bool
	done     chan struct{}
	n        atomic.Int64 // registrations acknowledged
	err      error        // set before done is closed
	// acked, when set, is told of each registration acknowledged.
	acked func()
}

// push starts registering agents prefix-0, prefix-1... up to limit.
func (sc *streamCluster) push(ctx context.Context, prefix string, limit int, acked func()) *pusher {
	p := &pusher{done: make(chan struct{}), acked: acked}
	go func() {
		defer close(p.done)
		for i := 0; i < limit && !p.stopping.Load(); i++ {
			ip := fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)
			if _, err := registerRetrying(ctx, sc.op, api.RegisterRequest{AgentID: fmt.Sprintf("%s-%d", prefix, i), IP: ip}); err != nil {
				p.err = fmt.Errorf("register %s-%d: %w", prefix, i, err)
				return
			}
			p.n.Add(1)
			if p.acked != nil {
				p.acked()
			}
		}
	}()
	sc.t.Cleanup(p.stop)
	return p
}

// stop ends the registrations and waits for the one in flight.
func (p *pusher) stop() {
	p.stopping.Store(true)
	<-p.done
}

// streamView is what a stream's reader holds: the index of its last
// changes frame, each agent's record version, the frames it read.
type streamView struct {
	index  uint64
	frames int
	agents map[string]uint64
}

func newStreamView(since uint64) *streamView {
	return &streamView{index: since, agents: map[string]uint64{}}
}

// apply merges a changes frame, which must follow the one before: a
// stream loses no change.
func (v *streamView) apply(ch *api.Changes) error {
	if ch.Since != v.index {
		return fmt.Errorf("a frame of the changes since %d after the frame at %d: a gap or an overlap", ch.Since, v.index)
	}
	v.frames++
	v.index = ch.Index
	for _, a := range ch.Agents {
		v.agents[a.AgentID] = a.Version
	}
	for _, tomb := range ch.Tombstones {
		delete(v.agents, tomb.AgentID)
	}
	return nil
}

// same tells how v differs from want (nil when it does not).
func (v *streamView) same(want *streamView) error {
	if v.index != want.index || len(v.agents) != len(want.agents) {
		return fmt.Errorf("index %d with %d agents, want %d with %d", v.index, len(v.agents), want.index, len(want.agents))
	}
	for id, ver := range want.agents {
		if v.agents[id] != ver {
			return fmt.Errorf("agent %s at version %d, want %d", id, v.agents[id], ver)
		}
	}
	return nil
}

// masterView is the streams' master's state as a view.
func (sc *streamCluster) masterView(ctx context.Context) *streamView {
	sc.t.Helper()
	cl := sc.onlyClient(sc.follower)
	var st *api.State
	if err := callRetrying(ctx, func() (err error) { st, err = cl.State(ctx, apiclient.StateOptions{}); return err }); err != nil {
		sc.t.Fatal(err)
	}
	v := newStreamView(st.Index)
	for _, a := range st.Agents {
		v.agents[a.AgentID] = a.Version
	}
	return v
}

// follower reads a stream from its own goroutine into its view.
type follower struct {
	name string
	mu   sync.Mutex
	view *streamView
	// beforeDrop is the index of the last frame read before the stalled
	// stream's connection failed a write.
	beforeDrop uint64
	err        error
	done       chan struct{}
	// close closes the stream and waits for the reader to end.
	close func()
}

// follow reads s into a view from since until s ends; stalled is the
// connection whose failure beforeDrop is relative to (nil: none).
func follow(t *testing.T, name string, s *apiclient.ChangeStream, since uint64, stalled *atomic.Pointer[bufferConn]) *follower {
	t.Helper()
	f := &follower{name: name, view: newStreamView(since), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			ch, err := s.Next()
			f.mu.Lock()
			if err == nil {
				err = f.view.apply(ch)
			}
			if err != nil {
				f.err = err
				f.mu.Unlock()
				return
			}
			if bc := stalled.Load(); bc != nil && !bc.hasFailed() {
				f.beforeDrop = ch.Index
			}
			f.mu.Unlock()
		}
	}()
	f.close = func() {
		s.Close()
		<-f.done
	}
	t.Cleanup(f.close)
	return f
}

// at tells whether the follower's view reached index, and fails on an
// error it met.
func (f *follower) at(index uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return fmt.Errorf("%s: %w", f.name, f.err)
	}
	if f.view.index < index {
		return fmt.Errorf("%s at index %d, want %d", f.name, f.view.index, index)
	}
	return nil
}

// rawStream is a stream read by hand over a TLS connection with a small
// receive buffer: after the response's headers, nothing reads it until
// the test does.
type rawStream struct {
	conn  *tls.Conn
	resp  *http.Response
	local string // the client's address, as the master sees it
}

// smallReceiveBuffer is a dialer whose connections have a receive buffer
// of streamTestBuffer, set before they connect (so the window they
// announce is small from the start).
func smallReceiveBuffer() *net.Dialer {
	return &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, streamTestBuffer)
		}); err != nil {
			return err
		}
		return serr
	}}
}

// openRawStream opens a changes stream at base since index since as the
// client of cfg, asking for heartbeats every hb; wrap, when set, wraps
// the TCP connection under TLS.
func openRawStream(ctx context.Context, t *testing.T, base string, cfg *tls.Config, since uint64, hb time.Duration, wrap func(net.Conn) net.Conn) *rawStream {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	d := smallReceiveBuffer()
	raw, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	local := raw.LocalAddr().String()
	if wrap != nil {
		raw = wrap(raw)
	}
	cfg = cfg.Clone()
	cfg.ServerName = u.Hostname()
	conn := tls.Client(raw, cfg)
	t.Cleanup(func() { conn.Close() })
	if err := conn.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	q := url.Values{"since": {strconv.FormatUint(since, 10)}, "heartbeat": {hb.String()}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+api.StreamPath+"?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 512), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("open a raw stream: %s", resp.Status)
	}
	return &rawStream{conn: conn, resp: resp, local: local}
}

// readAll reads the stream's frames into v until it ends; the error is
// how it ended.
func (rs *rawStream) readAll(v *streamView) error {
	frames := api.NewFrameReader(rs.resp.Body)
	for {
		fr, err := frames.Next()
		if err != nil {
			return err
		}
		switch fr.Kind {
		case api.FrameChanges:
			if err := v.apply(fr.Changes); err != nil {
				return err
			}
		case api.FrameEnd:
			return fr.End
		}
	}
}

// streamGoroutines is how many goroutines serve a changes stream in this
// process.
func streamGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "master.(*server).changesStream(")
}

// slowConn is a client's connection with a small receive buffer whose
// reads, once slowed, each wait for a token and take at most
// slowReadBytes: a client that reads, but less than the master sends.
type slowConn struct {
	net.Conn
	slowed atomic.Bool
	tokens chan struct{}
	free   chan struct{} // closed: reads no longer wait
	closed chan struct{}
	once   sync.Once
	// freeOnce closes free.
	freeOnce sync.Once
}

// slowReadBytes is what a slowed read takes at most.
const slowReadBytes = 16

func (c *slowConn) Read(p []byte) (int, error) {
	if c.slowed.Load() {
		select {
		case <-c.free:
		case <-c.tokens:
			select {
			case <-c.free:
			default:
				p = p[:min(len(p), slowReadBytes)]
			}
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Read(p)
}

func (c *slowConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// token lets one slowed read through; it never blocks (tokens beyond what
// the channel holds are not needed: free ends the slowing).
func (c *slowConn) token() {
	select {
	case c.tokens <- struct{}{}:
	default:
	}
}

// unslow lets every read through.
func (c *slowConn) unslow() { c.freeOnce.Do(func() { close(c.free) }) }

// slowClient is an agent's client of the streams' master whose one
// connection is a slowConn.
func (sc *streamCluster) slowClient(name string, ip int) (*apiclient.Client, *atomic.Pointer[slowConn]) {
	sc.t.Helper()
	sc.p.IssueAgent(name, netip.AddrFrom4([4]byte{198, 18, 0, byte(ip)}))
	var conn atomic.Pointer[slowConn]
	d := smallReceiveBuffer()
	tr := &http.Transport{
		TLSClientConfig: sc.p.ClientTLS(name, pki.RoleAgent),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			slow := &slowConn{Conn: c, tokens: make(chan struct{}, 1024), free: make(chan struct{}), closed: make(chan struct{})}
			conn.Store(slow)
			return slow, nil
		},
	}
	sc.t.Cleanup(tr.CloseIdleConnections)
	cl, err := apiclient.NewClient([]string{sc.urls()[sc.follower]}, &http.Client{Transport: tr})
	if err != nil {
		sc.t.Fatal(err)
	}
	return cl, &conn
}

// pacedConn is a client's connection over a slow link: each read waits
// for the next tick and takes at most pacedBytes.
type pacedConn struct {
	net.Conn
	tick   *time.Ticker
	closed chan struct{}
	once   sync.Once
}

// pacedBytes per pacedEvery: about 25 KB/s.
const (
	pacedBytes = 1024
	pacedEvery = 40 * time.Millisecond
)

func newPacedConn(c net.Conn) net.Conn {
	return &pacedConn{Conn: c, tick: time.NewTicker(pacedEvery), closed: make(chan struct{})}
}

func (c *pacedConn) Read(p []byte) (int, error) {
	select {
	case <-c.tick.C:
	case <-c.closed:
		return 0, net.ErrClosed
	}
	return c.Conn.Read(p[:min(len(p), pacedBytes)])
}

func (c *pacedConn) Close() error {
	c.once.Do(func() {
		c.tick.Stop()
		close(c.closed)
	})
	return c.Conn.Close()
}
