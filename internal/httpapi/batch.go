package httpapi

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
)

// batchBytes is how much of a large answer's TLS records go to the socket
// in one write. TLS cuts an answer into records of at most 16 KB and
// writes each one to the socket by itself; on a connection whose packets
// go straight to the peer (a veth, the loopback) every such write becomes
// its own trip through the kernel's TCP, bridge and netfilter path and a
// wakeup of the reader. At a 10,000-agent state (about 1 MB gzip'ed) those
// per-write costs, not the bytes, were most of the masters' kernel time.
// 256 KB lets the kernel send segments of the largest size (64 KB).
const batchBytes = 256 << 10

// maxBatches bounds the answers batched at once by one server, and so the
// memory of their buffers (8 MB), which are kept for the next answers (a
// sync.Pool would drop them at every other garbage collection and have
// them made again under load). Answers beyond it, say the blocking state
// watches of thousands of agents woken together, go unbatched.
const maxBatches = 32

// batchConn is a server connection under TLS that can gather the records
// of one large answer (see WriteLarge) and write them to the socket in
// batchBytes pieces; outside of a batch every write goes straight through.
type batchConn struct {
	net.Conn
	bufs *batchBuffers

	mu     sync.Mutex
	active bool
	buf    *[]byte // while active
	err    error   // a failed batched write: the stream lost bytes, every later write fails
}

// Write writes p, or gathers it while a batch is active. It fails once a
// batched write failed: TLS already counted the lost records as sent, so
// nothing may follow them on the connection.
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.active {
		return c.Conn.Write(p)
	}
	b := *c.buf
	if len(b)+len(p) > cap(b) && len(b) > 0 {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		b = *c.buf
	}
	if len(p) >= cap(b) {
		return c.Conn.Write(p)
	}
	*c.buf = append(b, p...)
	return len(p), nil
}

// begin starts gathering writes, unless every batch buffer is in use.
func (c *batchConn) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active {
		return
	}
	if c.buf = c.bufs.get(); c.buf != nil {
		c.active = true
	}
}

// end writes what was gathered and stops gathering.
func (c *batchConn) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.active {
		return c.err
	}
	err := c.flushLocked()
	c.bufs.put(c.buf)
	c.active, c.buf = false, nil
	return err
}

// flushLocked writes the gathered bytes; the caller holds c.mu.
func (c *batchConn) flushLocked() error {
	if len(*c.buf) == 0 {
		return c.err
	}
	_, err := c.Conn.Write(*c.buf)
	*c.buf = (*c.buf)[:0]
	if err != nil && c.err == nil {
		c.err = err
	}
	return err
}

// batchBuffers hands out at most maxBatches buffers of capacity
// batchBytes at once, and keeps those given back.
type batchBuffers struct {
	slots chan struct{} // one per buffer out
	free  chan *[]byte
}

func newBatchBuffers() *batchBuffers {
	return &batchBuffers{slots: make(chan struct{}, maxBatches), free: make(chan *[]byte, maxBatches)}
}

// get returns an empty buffer, or nil when maxBatches are out.
func (b *batchBuffers) get() *[]byte {
	select {
	case b.slots <- struct{}{}:
	default:
		return nil
	}
	select {
	case buf := <-b.free:
		return buf
	default:
		buf := make([]byte, 0, batchBytes)
		return &buf
	}
}

// put gives back a buffer that get returned.
func (b *batchBuffers) put(buf *[]byte) {
	*buf = (*buf)[:0]
	b.free <- buf // never blocks: at most maxBatches buffers exist
	<-b.slots
}

// batchListener hands out batchConns sharing one set of buffers.
type batchListener struct {
	net.Listener
	bufs *batchBuffers
}

func newBatchListener(ln net.Listener) *batchListener {
	return &batchListener{Listener: ln, bufs: newBatchBuffers()}
}

func (l *batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &batchConn{Conn: c, bufs: l.bufs}, nil
}

// batchKey is the request context key of the connection's batchConn.
type batchKey struct{}

// withBatchConn is the server's ConnContext: it puts the connection's
// batchConn (under TLS) into every request's context for WriteLarge.
func withBatchConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if bc, ok := c.(*batchConn); ok {
		return context.WithValue(ctx, batchKey{}, bc)
	}
	return ctx
}

// WriteLarge writes body, a large answer whose headers (Content-Length
// among them) are set, to the socket in few large writes when the request
// came through a Server over TLS, with a plain Write otherwise.
func WriteLarge(w http.ResponseWriter, r *http.Request, body []byte) error {
	bc, _ := r.Context().Value(batchKey{}).(*batchConn)
	if bc == nil {
		_, err := w.Write(body)
		return err
	}
	bc.begin()
	_, err := w.Write(body)
	if err == nil {
		// The server's buffer holds the last bytes: push them into TLS
		// (and so into the batch) before the batch ends.
		err = http.NewResponseController(w).Flush()
	}
	if eerr := bc.end(); err == nil {
		err = eerr
	}
	return err
}
