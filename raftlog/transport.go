package raftlog

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/carve-net/carve/internal/ratelog"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	// transportTimeout bounds one transport I/O operation (raft also uses it
	// to scale InstallSnapshot timeouts).
	transportTimeout = 10 * time.Second
	// transportMaxPool is the number of pooled connections per peer.
	transportMaxPool = 3
)

// refusedLogInterval is how often a refused incoming handshake is logged
// as a warning (every one is counted).
const refusedLogInterval = 10 * time.Second

// Directions of carve_raft_tls_handshake_failures_total.
const (
	directionIncoming = "incoming"
	directionOutgoing = "outgoing"
)

// streamLayer is raft's stream layer on a listener we bound (or were
// given), so that a pre-bound listener can be used; with TLS set, every
// connection is TLS, both accepted and dialed.
type streamLayer struct {
	net.Listener
	tls    *TransportTLS
	logger *slog.Logger
	failed *prometheus.CounterVec // TLS handshake failures by direction
	// refusedLog bounds the warnings of refused incoming handshakes: anyone
	// who reaches the port can fail one, as fast as they like.
	refusedLog *ratelog.Limiter
	live       liveConns // the TLS connections, both ways (peerconns.go)
	// history refuses peers of another history (history.go); server is
	// tls.Server with its check.
	history *historyGuard
	server  *tls.Config
}

// Accept returns the next connection. A TLS connection does its handshake
// on its first read or write, in raft's goroutine for that connection, so
// that a peer that never completes one delays nobody else.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil || s.tls == nil {
		return c, err
	}
	tc := tls.Server(c, s.server)
	s.live.add(tc)
	return &serverTLSConn{Conn: tc, layer: s}, nil
}

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", string(address))
	if err != nil || s.tls == nil {
		return c, err
	}
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("raft TLS: peer address %q: %w", address, err)
	}
	cfg := s.tls.Client.Clone()
	if s.tls.Refresh != nil {
		cfg = s.tls.Refresh(cfg)
	}
	cfg.ServerName = host
	cfg.NextProtos = s.history.clientProtos()
	tc := tls.Client(c, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		s.failed.WithLabelValues(directionOutgoing).Inc()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", address, s.history.dialFailed(string(address), err))
	}
	s.history.dialed(string(address), tc.ConnectionState().NegotiatedProtocol)
	s.live.add(tc)
	return &clientTLSConn{Conn: tc, live: &s.live}, nil
}

// serverTLSConn is an accepted TLS connection whose handshake runs, under
// transportTimeout, before its first read or write.
type serverTLSConn struct {
	*tls.Conn
	layer *streamLayer
	once  sync.Once
	err   error
}

func (c *serverTLSConn) handshake() error {
	c.once.Do(func() {
		_ = c.Conn.SetDeadline(time.Now().Add(transportTimeout))
		if err := c.Conn.Handshake(); err != nil {
			c.layer.failed.WithLabelValues(directionIncoming).Inc()
			level, suppressed := slog.LevelDebug, 0
			if ok, n := c.layer.refusedLog.Allow(); ok {
				level, suppressed = slog.LevelWarn, n
			}
			c.layer.logger.Log(context.Background(), level, "raft transport refused a connection in the TLS handshake",
				"remote", c.RemoteAddr().String(), "err", err, "not_logged_since", suppressed)
			// Logged here; raft would log any error but EOF once more as
			// an undecodable command.
			c.err = io.EOF
			return
		}
		// raft reads an idle connection without a deadline; clear ours.
		c.err = c.Conn.SetDeadline(time.Time{})
	})
	return c.err
}

// Close closes the connection and forgets it.
func (c *serverTLSConn) Close() error {
	c.layer.live.remove(c.Conn)
	return c.Conn.Close()
}

func (c *serverTLSConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *serverTLSConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// commitObservingTransport is raft's TCP transport with one addition: it
// reports the commit index carried by every AppendEntries request a leader
// sends this node. raft keeps a follower's commit index capped at its own
// last log entry, so only the request itself tells how far the cluster has
// committed; catching up after a restart needs exactly that (see CaughtUp).
type commitObservingTransport struct {
	*raft.NetworkTransport
	stream   *streamLayer
	rpcs     chan raft.RPC
	onCommit func(index uint64)
	stop     chan struct{}
	stopOnce sync.Once
}

// newStreamLayer is the stream layer on ln; with tls, every incoming
// handshake also applies the history rule (history.go).
func newStreamLayer(ln net.Listener, tlsCfg *TransportTLS, logger *slog.Logger, tlsFailures *prometheus.CounterVec, history *historyGuard) *streamLayer {
	s := &streamLayer{Listener: ln, tls: tlsCfg, logger: logger, failed: tlsFailures, refusedLog: ratelog.New(refusedLogInterval), history: history}
	if tlsCfg != nil {
		base := tlsCfg.Server
		s.server = &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			return history.serverConfig(base, hello)
		}}
	}
	return s
}

func newTransport(cfg Config, logger *slog.Logger, tlsFailures *prometheus.CounterVec, history *historyGuard, onCommit func(uint64)) (*commitObservingTransport, error) {
	ln := cfg.Listener
	if ln == nil {
		host, _, err := net.SplitHostPort(cfg.RaftAddr)
		if err != nil {
			return nil, fmt.Errorf("raftlog: config: RaftAddr %q: %w", cfg.RaftAddr, err)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return nil, fmt.Errorf("raftlog: config: RaftAddr %q: need an explicit host to advertise", cfg.RaftAddr)
		}
		ln, err = net.Listen("tcp", cfg.RaftAddr)
		if err != nil {
			return nil, fmt.Errorf("raftlog: listen on %s: %w", cfg.RaftAddr, err)
		}
	}
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("raftlog: listener address %s is not an advertisable TCP address", ln.Addr())
	}
	stream := newStreamLayer(ln, cfg.TLS, logger, tlsFailures, history)
	t := &commitObservingTransport{
		stream: stream,
		NetworkTransport: raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream:  stream,
			MaxPool: transportMaxPool,
			Timeout: transportTimeout,
			Logger:  newHCLogger(logger, "raft-net"),
			// One AppendEntries in flight per follower: raft's pipelined
			// replication can deadlock. When a follower refuses an append
			// (its disk full), the pipeline's decoder stops reading
			// responses; if the leader's sender, woken by a new write
			// before it notices, hands over one more request, the two
			// park on each other's unbuffered channel for good, and the
			// leader never sends that follower another entry while its
			// heartbeats go on (hashicorp/raft issue 612). Without
			// pipelining a refused append is retried with back-off, and
			// raft's own measurements find pipelining of little use with
			// batching (raft.NetworkTransportConfig.MaxRPCsInFlight).
			// TestFollowerCatchesUpOnceItsDiskIsFreed.
			MaxRPCsInFlight: 1,
		}),
		rpcs:     make(chan raft.RPC),
		onCommit: onCommit,
		stop:     make(chan struct{}),
	}
	go t.relay()
	return t, nil
}

// Consumer is where raft takes incoming RPCs from (raft.Transport).
func (t *commitObservingTransport) Consumer() <-chan raft.RPC { return t.rpcs }

// relay hands every incoming RPC to raft unchanged, noting leader commit
// indexes on the way. Heartbeats carry none and take raft's fast path.
func (t *commitObservingTransport) relay() {
	in := t.NetworkTransport.Consumer()
	for {
		select {
		case rpc := <-in:
			if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && req.LeaderCommitIndex > 0 {
				t.onCommit(req.LeaderCommitIndex)
			}
			select {
			case t.rpcs <- rpc:
			case <-t.stop:
				return
			}
		case <-t.stop:
			return
		}
	}
}

// Close stops the relay and closes the network transport (raft.WithClose).
func (t *commitObservingTransport) Close() error {
	t.stopOnce.Do(func() { close(t.stop) })
	return t.NetworkTransport.Close()
}
