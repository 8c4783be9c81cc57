package raftlog

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

const (
	// transportTimeout bounds one transport I/O operation (raft also uses it
	// to scale InstallSnapshot timeouts).
	transportTimeout = 10 * time.Second
	// transportMaxPool is the number of pooled connections per peer.
	transportMaxPool = 3
)

// streamLayer is raft's TCP stream layer on a listener we bound (or were
// given), so that a pre-bound listener can be used.
type streamLayer struct {
	net.Listener
}

func (s streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", string(address))
}

// commitObservingTransport is raft's TCP transport with one addition: it
// reports the commit index carried by every AppendEntries request a leader
// sends this node. raft keeps a follower's commit index capped at its own
// last log entry, so only the request itself tells how far the cluster has
// committed; catching up after a restart needs exactly that (see CaughtUp).
type commitObservingTransport struct {
	*raft.NetworkTransport
	rpcs     chan raft.RPC
	onCommit func(index uint64)
	stop     chan struct{}
	stopOnce sync.Once
}

func newTransport(cfg Config, logger *slog.Logger, onCommit func(uint64)) (*commitObservingTransport, error) {
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
	t := &commitObservingTransport{
		NetworkTransport: raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream:  streamLayer{ln},
			MaxPool: transportMaxPool,
			Timeout: transportTimeout,
			Logger:  newHCLogger(logger, "raft-net"),
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
