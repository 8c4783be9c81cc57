package raftlog

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/internal/ratelog"
)

// A log's history. raft matches a follower's log to the leader's by the
// (index, term) of one entry (AppendEntries' prevLogIndex/prevLogTerm) and
// trusts everything before it. That holds within one log, whose indexes
// and terms only grow; it does not hold across two logs that each started
// at index 1, term 1: a log bootstrapped again (a whole-cluster restore
// onto empty data directories) reuses the indexes and terms of the log
// before it, so a node started on a data directory of before finds an
// entry that "matches", keeps the old entries below it and has applied
// old commands the cluster never committed (issue 27). The state machine
// names the log it belongs to (HistoryReporter): the transport offers
// that name in every TLS handshake (ALPN) and refuses a peer that offers
// another, both ways, so two histories never exchange an entry, a vote or
// a snapshot. The name is kept in the stable store too, so a node knows
// it before its state machine has replayed anything.

// HistoryReporter is a StateMachine that names the history its state
// belongs to ("" while it does not know: a log that has not yet committed
// its first command). The name changes only from "" to a value, at one
// index of the log, the same on every node.
type HistoryReporter interface {
	History() string
}

// ErrOtherHistory marks a peer refused because it is of another history.
var ErrOtherHistory = errors.New("raft peer of another history")

const (
	// historyKey is the stable-store key of the node's history.
	historyKey = "CarveHistory"
	// historyProto prefixes the ALPN protocol that carries a history.
	historyProto = "carve-raft-history/"
	// historyConflictFor is how long a refusal shows in Status: a stale
	// peer that keeps running is refused again well within it (raft retries
	// a failing follower, and a candidate asks for votes, far more often).
	historyConflictFor = 2 * time.Minute
)

// Directions of carve_raft_history_refused_total are those of the TLS
// handshake failures (directionIncoming, directionOutgoing).

// historyGuard holds the node's history and applies the rule to handshakes.
type historyGuard struct {
	cur    atomic.Pointer[string]
	ready  chan struct{} // closed once Open has restored the state machine
	once   sync.Once
	logger *slog.Logger
	log    *ratelog.Limiter
	// refused counts refused peers by direction.
	refused *prometheus.CounterVec
	// persist stores a newly learned history (the stable store).
	persist func(string) error
	// changed runs when the history is learned (closes the connections
	// accepted before, which no handshake checked against it).
	changed func()

	mu sync.Mutex
	// conflicts are the last refusal of each peer host, until a handshake
	// with it agrees on the history or historyConflictFor passes.
	conflicts map[string]conflict
}

// conflict is one refusal: what to say, and when.
type conflict struct {
	msg string
	at  time.Time
}

func newHistoryGuard(logger *slog.Logger, refused *prometheus.CounterVec) *historyGuard {
	g := &historyGuard{ready: make(chan struct{}), logger: logger, log: ratelog.New(refusedLogInterval), refused: refused,
		conflicts: map[string]conflict{}}
	empty := ""
	g.cur.Store(&empty)
	return g
}

// get is the node's history ("" unknown).
func (g *historyGuard) get() string { return *g.cur.Load() }

// markReady lets incoming handshakes go on (Open is done, or failed).
func (g *historyGuard) markReady() { g.once.Do(func() { close(g.ready) }) }

// load sets the history read from the stable store at Open.
func (g *historyGuard) load(h string) {
	if h != "" {
		g.cur.Store(&h)
	}
}

// observe takes the history the state machine names after it changed.
func (g *historyGuard) observe(sm StateMachine) {
	r, ok := sm.(HistoryReporter)
	if !ok {
		return
	}
	h := r.History()
	prev := g.get()
	if h == "" || h == prev {
		return
	}
	g.cur.Store(&h)
	if prev != "" {
		// A node whose state moves to another history got it from a peer
		// of that history, which the handshake allowed only while one of
		// them did not know its own (a snapshot installed, say).
		g.logger.Warn("raft history changed", "history", h, "previous", prev)
	} else {
		g.logger.Info("raft history learned: peers of another history are refused", "history", h)
	}
	if g.persist != nil {
		if err := g.persist(h); err != nil {
			g.logger.Warn("persist raft history", "history", h, "err", err)
		}
	}
	if g.changed != nil {
		g.changed()
	}
}

// proto is the ALPN protocol naming history h.
func proto(h string) string { return historyProto + h }

// offered is the history a client hello offers ("" none: a node that
// does not know its own, or of a version before histories).
func offered(protos []string) string {
	for _, p := range protos {
		if h, ok := strings.CutPrefix(p, historyProto); ok {
			return h
		}
	}
	return ""
}

// clientProtos are the ALPN protocols to offer when dialing.
func (g *historyGuard) clientProtos() []string {
	if h := g.get(); h != "" {
		return []string{proto(h)}
	}
	return nil
}

// serverConfig returns the configuration for one incoming handshake: base
// with the protocol to agree on. A peer that offers another history gets a
// configuration that agrees on none, and the handshake fails with
// no_application_protocol, which is what the peer's dial reports.
func (g *historyGuard) serverConfig(base *tls.Config, hello *tls.ClientHelloInfo) (*tls.Config, error) {
	select {
	case <-g.ready:
	case <-time.After(transportTimeout):
		return nil, errors.New("raft node still starting")
	}
	if base.GetConfigForClient != nil {
		c, err := base.GetConfigForClient(hello)
		if err != nil {
			return nil, err
		}
		if c != nil {
			base = c
		}
	}
	cfg := base.Clone()
	cfg.NextProtos = nil
	peer, mine := offered(hello.SupportedProtos), g.get()
	switch {
	case peer == "":
		// A node that knows no history yet: on a host whose master was
		// refused, it is that master on an empty data directory (the fix
		// HistoryFix names), whose history it learns from the leader. A
		// follower may hear from it only so: it does not dial it.
		g.agreed(hello.Conn.RemoteAddr().String())
	case mine == "" || peer == mine:
		cfg.NextProtos = []string{proto(peer)}
		if peer == mine {
			g.agreed(hello.Conn.RemoteAddr().String())
		}
	default:
		g.refuse(directionIncoming, hello.Conn.RemoteAddr().String(), peer)
		cfg.NextProtos = []string{proto(mine)}
	}
	return cfg, nil
}

// dialFailed turns the error of a refused dial into one that says why.
func (g *historyGuard) dialFailed(address string, err error) error {
	if mine := g.get(); mine != "" && strings.Contains(err.Error(), "no application protocol") {
		g.refuse(directionOutgoing, address, "")
		return fmt.Errorf("%w: %s refused this node's history %s (%v)", ErrOtherHistory, address, mine, err)
	}
	return err
}

// refuse counts, notes and logs a refused peer (peer: its history, "" when
// it refused us and did not say).
func (g *historyGuard) refuse(direction, remote, peer string) {
	g.refused.WithLabelValues(direction).Inc()
	mine := g.get()
	what := fmt.Sprintf("raft peer %s is of history %s, this node's is %s", remote, orUnknown(peer), mine)
	if peer == "" {
		what = fmt.Sprintf("raft peer %s refused this node's history %s (it is of another)", remote, mine)
	}
	msg := what + ": masters of different histories never exchange log entries or votes. " + HistoryFix
	g.mu.Lock()
	g.conflicts[hostOf(remote)] = conflict{msg: msg, at: time.Now()}
	g.mu.Unlock()
	level, n := slog.LevelDebug, 0
	if ok, suppressed := g.log.Allow(); ok {
		level, n = slog.LevelError, suppressed
	}
	g.logger.Log(context.Background(), level, "refused a raft peer of another history", "peer", remote,
		"peer_history", peer, "history", mine, "direction", direction, "fix", HistoryFix, "not_logged_since", n)
}

// HistoryFix is what to do about masters of different histories.
const HistoryFix = "The master of the older history (a data directory from before a whole-cluster restore: its history's restore epoch is lower, or it has none) must not come back on it: " +
	"stop it, move its data directory away and start it on an empty one: a master of the --peers gets the log from the leader, another is removed and joined again (docs/operations.md, sections 6 and 9a)."

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// agreed forgets the refusal of a peer host once a handshake with it
// agreed on the history (it was moved to an empty data directory).
func (g *historyGuard) agreed(remote string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.conflicts, hostOf(remote))
}

// dialed notes a handshake that went through: agreed when both sides
// named the node's history.
func (g *historyGuard) dialed(address, negotiated string) {
	if mine := g.get(); mine != "" && negotiated == proto(mine) {
		g.agreed(address)
	}
}

// lastConflict is the latest refusal of a peer not agreed with since,
// within historyConflictFor ("" none).
func (g *historyGuard) lastConflict() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var last conflict
	for host, c := range g.conflicts {
		if time.Since(c.at) > historyConflictFor {
			delete(g.conflicts, host)
			continue
		}
		if c.at.After(last.at) {
			last = c
		}
	}
	return last.msg
}

// hostOf is the host of a host:port (the port of an incoming connection
// changes with every connection), or the address itself.
func hostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// readHistory reads the history the stable store holds ("" none).
func readHistory(s raft.StableStore) string {
	b, err := s.Get([]byte(historyKey))
	if err != nil {
		return "" // raft-boltdb answers a missing key with an error
	}
	return string(b)
}

// History is the name of the history this node's log belongs to, as its
// state machine last named it ("" not known yet); see HistoryReporter.
func (n *Node) History() string { return n.history.get() }

// HistoryConflict describes the last peer refused for being of another
// history, in the last two minutes, and what to do ("": none).
func (n *Node) HistoryConflict() string { return n.history.lastConflict() }
