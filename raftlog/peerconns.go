package raftlog

import (
	"crypto/tls"
	"crypto/x509"
	"sync"
)

// liveConns are the TLS connections of the transport, both ways, so that
// those of a peer whose certificate is no longer trusted (revoked) can be
// closed: raft keeps pooled connections for as long as they work, and a
// handshake check alone would leave them open.
type liveConns struct {
	mu    sync.Mutex
	conns map[*tls.Conn]struct{}
}

func (l *liveConns) add(c *tls.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		l.conns = map[*tls.Conn]struct{}{}
	}
	l.conns[c] = struct{}{}
}

func (l *liveConns) remove(c *tls.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
}

// closeWhere closes the connections whose peer's certificate refuse
// matches and returns how many; a connection still in its handshake is
// checked by the handshake itself.
func (l *liveConns) closeWhere(refuse func(*x509.Certificate) bool) int {
	l.mu.Lock()
	var doomed []*tls.Conn
	for c := range l.conns {
		cs := c.ConnectionState()
		if cs.HandshakeComplete && len(cs.PeerCertificates) > 0 && refuse(cs.PeerCertificates[0]) {
			doomed = append(doomed, c)
			delete(l.conns, c)
		}
	}
	l.mu.Unlock()
	for _, c := range doomed {
		_ = c.Close()
	}
	return len(doomed)
}

// clientTLSConn is a dialled TLS connection that leaves liveConns when
// closed.
type clientTLSConn struct {
	*tls.Conn
	live *liveConns
}

func (c *clientTLSConn) Close() error {
	c.live.remove(c.Conn)
	return c.Conn.Close()
}

// CloseConnsWhere closes the Raft transport's connections, both ways,
// whose peer's certificate refuse matches (a certificate just revoked),
// and returns how many it closed. raft dials again, and the handshake
// refuses the peer from then on.
func (n *Node) CloseConnsWhere(refuse func(*x509.Certificate) bool) int {
	return n.trans.stream.live.closeWhere(refuse)
}
