package raftlog

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/carve-net/carve/test/lab/testutil"
)

// recordingFSM remembers every command it applied, by index.
type recordingFSM struct {
	mu      sync.Mutex
	applied map[uint64]string
}

func (f *recordingFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied[l.Index] = string(l.Data)
	return nil
}

func (f *recordingFSM) Snapshot() (raft.FSMSnapshot, error) {
	return nil, fmt.Errorf("no snapshots here")
}
func (f *recordingFSM) Restore(io.ReadCloser) error { return fmt.Errorf("no snapshots here") }

func (f *recordingFSM) get(index uint64) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.applied[index]
	return s, ok
}

// TestFollowerAppliesOnlyEntriesTheLeaderVerified replays the divergence of
// two masters at the same index (issue 26, item 0): a follower holds, beyond
// the entries it shares with the new leader, a tail of entries of an older
// term that were never committed (it led that term, or heard from a leader
// that did). The new leader sends an AppendEntries that matches an earlier
// prefix (a batch of MaxAppendEntries that ends before that tail) and carries
// a commit index beyond it. The Raft paper's rule is commitIndex =
// min(leaderCommit, index of the last new entry): only what the request
// verified may be committed. hashicorp/raft took min(leaderCommit, the
// follower's last index), so the follower committed and applied its stale
// tail, entries the cluster never committed, and its state machine differed
// from every other replica's at the same index forever after.
func TestFollowerAppliesOnlyEntriesTheLeaderVerified(t *testing.T) {
	const follower, leader = raft.ServerID("f"), raft.ServerID("l")
	logs, stable, snaps := raft.NewInmemStore(), raft.NewInmemStore(), raft.NewInmemSnapshotStore()
	conf := raft.Configuration{Servers: []raft.Server{
		{Suffrage: raft.Voter, ID: follower, Address: raft.ServerAddress(follower)},
		{Suffrage: raft.Voter, ID: leader, Address: raft.ServerAddress(leader)},
	}}
	// The follower's log: the configuration at 1, commands 2..5 of term 1
	// that every replica shares, and 6..8 of term 1 that the old leader
	// appended but never committed.
	entries := []*raft.Log{{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(conf)}}
	for i := uint64(2); i <= 8; i++ {
		entries = append(entries, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: fmt.Appendf(nil, "old-%d", i)})
	}
	if err := logs.StoreLogs(entries); err != nil {
		t.Fatal(err)
	}
	if err := stable.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		t.Fatal(err)
	}

	cfg := raft.DefaultConfig()
	cfg.LocalID = follower
	// The follower must not start an election of its own while the test
	// plays its leader: the timeouts are far beyond the test's length.
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Hour, time.Hour, time.Hour
	cfg.Logger = newHCLogger(testLogger("f"), "raft")
	_, followerTrans := raft.NewInmemTransport(raft.ServerAddress(follower))
	_, leaderTrans := raft.NewInmemTransport(raft.ServerAddress(leader))
	followerTrans.Connect(raft.ServerAddress(leader), leaderTrans)
	leaderTrans.Connect(raft.ServerAddress(follower), followerTrans)
	fsm := &recordingFSM{applied: map[uint64]string{}}
	r, err := raft.NewRaft(cfg, fsm, logs, stable, snaps, followerTrans)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown().Error() })

	// The new leader of term 2 committed its own entries at 6..10. Its
	// first request matches the follower at 3 and carries 4 and 5 (which
	// the follower has), with the leader's commit index, 10.
	var resp raft.AppendEntriesResponse
	req := raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(leader), Addr: []byte(leader)},
		Term:              2,
		PrevLogEntry:      3,
		PrevLogTerm:       1,
		Entries:           slices.Clone(entries[3:5]),
		LeaderCommitIndex: 10,
	}
	if err := leaderTrans.AppendEntries(follower, raft.ServerAddress(follower), &req, &resp); err != nil {
		t.Fatal(err)
	}
	if !resp.Success {
		t.Fatalf("the follower refused a request that matches its log: %+v", resp)
	}
	// 2..5 were verified and committed: they are applied. Wait for them
	// before reading the rest (the FSM applies on its own goroutine).
	testutil.Eventually(t, 10*time.Second, "the follower applies 2..5", func() error {
		if _, ok := fsm.get(5); !ok {
			return fmt.Errorf("entry 5 not applied yet")
		}
		return nil
	})
	// A barrier would need leadership; instead send the next request, which
	// replaces 6..8 with the leader's entries, and read what was applied
	// at 6..8 once those have been applied too.
	var next []*raft.Log
	for i := uint64(6); i <= 10; i++ {
		next = append(next, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: fmt.Appendf(nil, "new-%d", i)})
	}
	req2 := raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(leader), Addr: []byte(leader)},
		Term:              2,
		PrevLogEntry:      5,
		PrevLogTerm:       1,
		Entries:           next,
		LeaderCommitIndex: 10,
	}
	if err := leaderTrans.AppendEntries(follower, raft.ServerAddress(follower), &req2, &resp); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the follower applies 6..8", func() error {
		if _, ok := fsm.get(8); !ok {
			return fmt.Errorf("entry 8 not applied yet")
		}
		return nil
	})
	for i := uint64(6); i <= 8; i++ {
		got, _ := fsm.get(i)
		if want := fmt.Sprintf("new-%d", i); got != want {
			t.Errorf("the follower applied %q at index %d, which the leader never committed there; want %q (the leader's entry)", got, i, want)
		}
	}
}
