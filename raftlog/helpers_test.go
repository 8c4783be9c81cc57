package raftlog

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/testutil"
)

// testSM is a deterministic state machine: it counts every command and keeps
// a running hash over (index, command), so two replicas that applied the same
// commands at the same indexes in the same order have the same hash.
type testSM struct {
	mu           sync.Mutex
	hash         [32]byte
	count        int
	seen         map[string]int
	lastIndex    uint64 // index of the last command applied
	restores     int
	restoreIndex uint64
}

func newTestSM() *testSM { return &testSM{seen: map[string]int{}} }

type applyResult struct {
	Index uint64
	Count int
}

func (s *testSM) Apply(index uint64, cmd []byte) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.lastIndex {
		panic(fmt.Sprintf("testSM: index went backwards: %d after %d", index, s.lastIndex))
	}
	h := sha256.New()
	h.Write(s.hash[:])
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], index)
	h.Write(b[:])
	h.Write(cmd)
	copy(s.hash[:], h.Sum(nil))
	s.count++
	s.seen[string(cmd)]++
	s.lastIndex = index
	return applyResult{Index: index, Count: s.count}
}

type smState struct {
	Hash      string         `json:"hash"`
	Count     int            `json:"count"`
	Seen      map[string]int `json:"seen"`
	LastIndex uint64         `json:"last_index"`
}

type testSnap struct{ st smState }

func (s *testSnap) WriteTo(w io.Writer) (int64, error) {
	b, err := json.Marshal(s.st)
	if err != nil {
		return 0, err
	}
	n, err := w.Write(b)
	return int64(n), err
}

func (s *testSnap) Release() {}

func (s *testSM) Snapshot() (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]int, len(s.seen))
	for k, v := range s.seen {
		seen[k] = v
	}
	return &testSnap{st: smState{Hash: hex.EncodeToString(s.hash[:]), Count: s.count, Seen: seen, LastIndex: s.lastIndex}}, nil
}

func (s *testSM) Restore(index uint64, r io.Reader) error {
	var st smState
	if err := json.NewDecoder(r).Decode(&st); err != nil {
		return err
	}
	h, err := hex.DecodeString(st.Hash)
	if err != nil || len(h) != 32 {
		return fmt.Errorf("bad hash %q", st.Hash)
	}
	if st.LastIndex > index {
		return fmt.Errorf("snapshot state has index %d beyond header index %d", st.LastIndex, index)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(s.hash[:], h)
	s.count = st.Count
	s.seen = st.Seen
	if s.seen == nil {
		s.seen = map[string]int{}
	}
	s.lastIndex = st.LastIndex
	s.restores++
	s.restoreIndex = index
	return nil
}

// fingerprint summarises the state for comparisons between replicas.
type fingerprint struct {
	Hash      string
	Count     int
	LastIndex uint64
}

func (s *testSM) fingerprint() fingerprint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fingerprint{Hash: hex.EncodeToString(s.hash[:8]), Count: s.count, LastIndex: s.lastIndex}
}

func (s *testSM) times(cmd string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[cmd]
}

func (s *testSM) snapshotSeen() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.seen))
	for k, v := range s.seen {
		out[k] = v
	}
	return out
}

func (s *testSM) restoreCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restores
}

// testLogger discards logs unless RAFTLOG_TEST_LOG is set.
func testLogger(id string) *slog.Logger {
	if os.Getenv("RAFTLOG_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_node", id)
}

// testNode is one member of a test cluster; it survives restarts of its Node.
type testNode struct {
	id   string
	dir  string
	addr string
	ln   net.Listener // pre-bound listener for the first Open
	sm   *testSM
	node *Node // nil while stopped
}

// cluster is a set of nodes in one process talking over TCP on 127.0.0.1.
type cluster struct {
	t      testing.TB
	nodes  []*testNode
	peers  []Server
	tune   func(*Config)
	joined int // number of nodes created, for IDs
}

// fastTimeouts are the tests' Raft timeouts: raftlog's defaults. Shorter
// ones (400 ms elections, a 200 ms lease) flapped on a 2-core machine under
// -race beside other packages: a new voter catching up by snapshot saw no
// stable leader for 20 s (TestAddVoterCatchesUpViaSnapshotAndRemove).
func fastTimeouts(c *Config) {
	c.HeartbeatTimeout = DefaultHeartbeatTimeout
	c.ElectionTimeout = DefaultElectionTimeout
	c.LeaderLeaseTimeout = DefaultLeaderLeaseTimeout
}

func listenLocal(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return ln
}

// newCluster starts n nodes bootstrapped from the same Peers list.
func newCluster(t testing.TB, n int, tune func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, tune: tune}
	for i := 0; i < n; i++ {
		tn := c.newTestNode()
		c.peers = append(c.peers, Server{ID: tn.id, Address: tn.addr, Voter: true})
	}
	for _, tn := range c.nodes {
		c.start(tn, c.peers)
	}
	return c
}

func (c *cluster) newTestNode() *testNode {
	c.t.Helper()
	c.joined++
	ln := listenLocal(c.t)
	tn := &testNode{
		id:   fmt.Sprintf("n%d", c.joined),
		dir:  filepath.Join(c.t.TempDir(), "data"),
		addr: ln.Addr().String(),
		ln:   ln,
	}
	c.nodes = append(c.nodes, tn)
	c.t.Cleanup(func() {
		if tn.ln != nil {
			_ = tn.ln.Close()
		}
		c.stop(tn)
	})
	return tn
}

func (c *cluster) config(tn *testNode, peers []Server) Config {
	cfg := Config{
		ID:      tn.id,
		DataDir: tn.dir,
		Peers:   peers,
		Logger:  testLogger(tn.id),
	}
	if tn.ln != nil {
		cfg.Listener = tn.ln
		tn.ln = nil
	} else {
		cfg.RaftAddr = tn.addr
	}
	fastTimeouts(&cfg)
	if c.tune != nil {
		c.tune(&cfg)
	}
	return cfg
}

// start opens tn's node with a fresh state machine (state comes back from
// the data dir).
func (c *cluster) start(tn *testNode, peers []Server) {
	c.t.Helper()
	tn.sm = newTestSM()
	n, err := Open(context.Background(), c.config(tn, peers), tn.sm)
	if err != nil {
		c.t.Fatalf("open %s: %v", tn.id, err)
	}
	if n.Addr() != tn.addr {
		c.t.Fatalf("%s: Addr() = %s, want %s", tn.id, n.Addr(), tn.addr)
	}
	tn.node = n
}

func (c *cluster) stop(tn *testNode) {
	if tn.node == nil {
		return
	}
	if err := tn.node.Close(); err != nil {
		c.t.Errorf("close %s: %v", tn.id, err)
	}
	tn.node = nil
}

func (c *cluster) running() []*testNode {
	var out []*testNode
	for _, tn := range c.nodes {
		if tn.node != nil {
			out = append(out, tn)
		}
	}
	return out
}

// waitLeader waits until exactly one of the given (running) nodes is leader
// and all of them agree on it.
func (c *cluster) waitLeader(nodes ...*testNode) *testNode {
	c.t.Helper()
	if len(nodes) == 0 {
		nodes = c.running()
	}
	var leader *testNode
	testutil.Eventually(c.t, 0, "a leader", func() error {
		leader = nil
		for _, tn := range nodes {
			if tn.node.IsLeader() {
				if leader != nil {
					return fmt.Errorf("two leaders: %s and %s", leader.id, tn.id)
				}
				leader = tn
			}
		}
		if leader == nil {
			return errors.New("no leader")
		}
		for _, tn := range nodes {
			if id, addr := tn.node.Leader(); id != leader.id || addr != leader.addr {
				return fmt.Errorf("%s thinks the leader is %q (%s), not %s", tn.id, id, addr, leader.id)
			}
		}
		return nil
	})
	return leader
}

// apply applies cmd on the current leader, retrying while leadership moves.
func (c *cluster) apply(cmd string) (applyResult, uint64) {
	c.t.Helper()
	var res applyResult
	var index uint64
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := retry.Until(ctx, 20*time.Millisecond, func() error {
		leader := c.waitLeader()
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, idx, err := leader.node.Apply(actx, []byte(cmd))
		cancel()
		if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrUnknownOutcome) {
			return err
		}
		if err != nil {
			return retry.Permanent(fmt.Errorf("on %s: %w", leader.id, err))
		}
		r, ok := out.(applyResult)
		if !ok {
			return retry.Permanent(fmt.Errorf("result %T, want applyResult", out))
		}
		if r.Index != idx {
			return retry.Permanent(fmt.Errorf("result index %d != returned index %d", r.Index, idx))
		}
		res, index = r, idx
		return nil
	})
	if err != nil {
		c.t.Fatalf("apply %q: %v", cmd, err)
	}
	return res, index
}

func (c *cluster) applyN(prefix string, n int) uint64 {
	c.t.Helper()
	var last uint64
	for i := 0; i < n; i++ {
		_, last = c.apply(fmt.Sprintf("%s-%d", prefix, i))
	}
	return last
}

// waitConverged waits until the given nodes have identical state that
// includes at least index minIndex, and returns it.
func (c *cluster) waitConverged(minIndex uint64, nodes ...*testNode) fingerprint {
	c.t.Helper()
	if len(nodes) == 0 {
		nodes = c.running()
	}
	var fp fingerprint
	testutil.Eventually(c.t, 30*time.Second, "replicas to converge", func() error {
		fp = nodes[0].sm.fingerprint()
		if fp.LastIndex < minIndex {
			return fmt.Errorf("%s at index %d < %d", nodes[0].id, fp.LastIndex, minIndex)
		}
		for _, tn := range nodes[1:] {
			if got := tn.sm.fingerprint(); got != fp {
				return fmt.Errorf("%s has %+v, %s has %+v", nodes[0].id, fp, tn.id, got)
			}
		}
		return nil
	})
	return fp
}

func (c *cluster) followers() []*testNode {
	var out []*testNode
	for _, tn := range c.running() {
		if !tn.node.IsLeader() {
			out = append(out, tn)
		}
	}
	return out
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
