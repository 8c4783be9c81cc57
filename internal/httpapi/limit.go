package httpapi

import (
	"container/list"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// unauthLimits bound the connections of clients without a certificate;
// zero: no such bound (every connection counts as authenticated).
type unauthLimits struct {
	conns   int
	timeout time.Duration
}

// limitListener holds at most cap(sem) connections. Under unauthLimits it
// keeps the connections that have not presented a client certificate in
// accept order, holds at most limits.conns of them (a new one closes the
// oldest), and when every slot is taken closes the oldest of them rather
// than wait: a flood of idle connections without a certificate can never
// keep agents, operators or masters out; and when authenticated
// connections hold every slot, the next connection is turned away (reset)
// unless a slot freed while it came: its client tries another master at
// once, where in the backlog it would wait out its handshake timeout (10 s
// for agents) before it did, and a failover's thousands of reconnecting
// agents did so again and again. A plain server (no unauthLimits) cannot
// tell its clients apart: Accept waits for a connection to close before
// taking the next from the backlog.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	limits    unauthLimits
	evicted   atomic.Uint64
	shed      atomic.Uint64 // connections turned away: every slot held

	mu     sync.Mutex
	unauth list.List // of *limitConn not authenticated yet, oldest first
}

func newLimitListener(ln net.Listener, n int, limits unauthLimits) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{}), limits: limits}
}

// Accept takes the next connection from the backlog, then a slot for it:
// a free one, or the oldest unauthenticated connection's (closed). Without
// one it turns the connection away (or, on a plain server, waits for a
// slot). A slot is taken only when a connection came for it, so a server
// at its cap closes no connection before one does.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.takeSlot() {
			return l.track(c), nil
		}
		if l.limits.conns > 0 {
			l.turnAway(c)
			continue
		}
		// No certificates to tell clients apart (a plain server): the
		// connection waits for a slot, the next ones in the backlog.
		select {
		case l.sem <- struct{}{}:
			return l.track(c), nil
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

// takeSlot takes a free slot, or the slot of the oldest unauthenticated
// connection (closed for it); false when authenticated connections hold
// every slot.
func (l *limitListener) takeSlot() bool {
	select {
	case l.sem <- struct{}{}:
		return true
	default:
	}
	l.evictOldest()
	select {
	case l.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// turnAway resets c (no slot for it): its client learns at once.
func (l *limitListener) turnAway(c net.Conn) {
	l.shed.Add(1)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// track wraps c, which holds a slot, and counts it among the
// unauthenticated connections (closing the oldest beyond their share).
func (l *limitListener) track(c net.Conn) net.Conn {
	lc := &limitConn{Conn: c, l: l}
	if l.limits.conns == 0 {
		lc.authenticated.Store(true)
		return lc
	}
	l.mu.Lock()
	var oldest *limitConn
	if l.unauth.Len() >= l.limits.conns {
		oldest = l.unauth.Front().Value.(*limitConn)
		l.removeLocked(oldest)
	}
	lc.elem = l.unauth.PushBack(lc)
	l.mu.Unlock()
	if oldest != nil {
		l.evict(oldest)
	}
	return lc
}

// evictOldest closes the oldest unauthenticated connection, if any.
func (l *limitListener) evictOldest() {
	l.mu.Lock()
	front := l.unauth.Front()
	if front == nil {
		l.mu.Unlock()
		return
	}
	c := front.Value.(*limitConn)
	l.removeLocked(c)
	l.mu.Unlock()
	l.evict(c)
}

// evict closes c (removed from unauth) and gives its slot back now: the
// server's goroutine that serves it fails on its next read or write.
func (l *limitListener) evict(c *limitConn) {
	l.evicted.Add(1)
	_ = c.Conn.Close()
	c.once.Do(c.release)
}

func (l *limitListener) removeLocked(c *limitConn) {
	if c.elem != nil {
		l.unauth.Remove(c.elem)
		c.elem = nil
	}
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

func (l *limitListener) open() int { return len(l.sem) }

// limitConn gives its slot back once, on the first Close or eviction.
// While not authenticated its read deadlines are at most
// unauthLimits.timeout away.
type limitConn struct {
	net.Conn
	l             *limitListener
	once          sync.Once
	authenticated atomic.Bool
	elem          *list.Element // in l.unauth; guarded by l.mu
}

func (c *limitConn) release() { <-c.l.sem }

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	if !c.authenticated.Load() {
		c.l.mu.Lock()
		c.l.removeLocked(c)
		c.l.mu.Unlock()
	}
	c.once.Do(c.release)
	return err
}

// authenticate takes c out of the unauthenticated connections: its
// deadlines are the server's own from now on.
func (c *limitConn) authenticate() {
	if c.authenticated.Swap(true) {
		return
	}
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
}

// bound shortens a read deadline of an unauthenticated connection to
// unauthLimits.timeout from now (no deadline counts as the farthest).
func (c *limitConn) bound(t time.Time) time.Time {
	if c.authenticated.Load() {
		return t
	}
	limit := time.Now().Add(c.l.limits.timeout)
	if t.IsZero() || t.After(limit) {
		return limit
	}
	return t
}

func (c *limitConn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.bound(t)) }

func (c *limitConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(c.bound(t))
}

// markAuthenticated is the server's ConnState hook: a TLS connection whose
// client presented a certificate that verified against the CA is
// authenticated once its first request is read (the handshake is done by
// then).
func markAuthenticated(c net.Conn, s http.ConnState) {
	if s != http.StateActive {
		return
	}
	tc, ok := c.(*tls.Conn)
	if !ok || len(tc.ConnectionState().VerifiedChains) == 0 {
		return
	}
	if lc := limitConnOf(tc.NetConn()); lc != nil {
		lc.authenticate()
	}
}

// limitConnOf finds the limitConn under the server's wrappers.
func limitConnOf(c net.Conn) *limitConn {
	for {
		switch v := c.(type) {
		case *limitConn:
			return v
		case *batchConn:
			c = v.Conn
		default:
			return nil
		}
	}
}
