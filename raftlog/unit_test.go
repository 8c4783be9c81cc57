package raftlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

func TestSnapshotHeader(t *testing.T) {
	var buf bytes.Buffer
	if err := writeSnapHeader(&buf, 12345); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("payload")
	idx, err := readSnapHeader(&buf)
	if err != nil || idx != 12345 {
		t.Fatalf("readSnapHeader = %d, %v", idx, err)
	}
	if rest := buf.String(); rest != "payload" {
		t.Fatalf("payload after header = %q", rest)
	}

	good := func() []byte {
		var b bytes.Buffer
		_ = writeSnapHeader(&b, 7)
		return b.Bytes()
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"short", good()[:10], "read snapshot header"},
		{"bad magic", append([]byte("XXXX"), good()[4:]...), "not a raftlog snapshot"},
		{"bad version", func() []byte { b := good(); b[7] = 9; return b }(), "unsupported raftlog snapshot version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readSnapHeader(bytes.NewReader(tt.data))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	closed, canceled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) Cancel() error { s.canceled = true; return nil }

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

func TestFSMAdapterSkipsNonCommandsAndRoundTrips(t *testing.T) {
	sm := newTestSM()
	f := newFSMAdapter(sm)
	logs := []*raft.Log{
		{Index: 1, Type: raft.LogConfiguration, Data: []byte("conf")},
		{Index: 2, Type: raft.LogCommand, Data: []byte("a")},
		{Index: 3, Type: raft.LogCommand, Data: []byte("b")},
		{Index: 4, Type: raft.LogConfiguration, Data: []byte("conf")},
	}
	res := f.ApplyBatch(logs)
	if len(res) != 4 || res[0] != nil || res[3] != nil {
		t.Fatalf("results %v", res)
	}
	if r := res[2].(applyResult); r.Index != 3 || r.Count != 2 {
		t.Fatalf("result for index 3 = %+v", r)
	}
	if f.applied.Load() != 4 {
		t.Fatalf("applied = %d, want 4", f.applied.Load())
	}
	if got := f.Apply(&raft.Log{Index: 5, Type: raft.LogCommand, Data: []byte("c")}).(applyResult); got.Index != 5 {
		t.Fatalf("Apply result %+v", got)
	}

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil || !sink.closed {
		t.Fatalf("persist: %v closed=%v", err, sink.closed)
	}
	snap.Release()

	sm2 := newTestSM()
	f2 := newFSMAdapter(sm2)
	if err := f2.Restore(nopCloser{bytes.NewReader(sink.Bytes())}); err != nil {
		t.Fatal(err)
	}
	if f2.applied.Load() != 5 || sm2.restoreIndex != 5 || sm2.fingerprint() != sm.fingerprint() {
		t.Fatalf("restored applied=%d index=%d %+v, want %+v", f2.applied.Load(), sm2.restoreIndex, sm2.fingerprint(), sm.fingerprint())
	}
	if err := f2.Restore(nopCloser{bytes.NewReader([]byte("garbage garbage garbage"))}); err == nil {
		t.Fatal("restore of garbage succeeded")
	}
}

func TestPersistCancelsOnError(t *testing.T) {
	s := &fsmSnapshot{s: writeErrSnap{}, index: 1}
	var sink memSink
	if err := s.Persist(&sink); err == nil || !sink.canceled || sink.closed {
		t.Fatalf("err=%v canceled=%v closed=%v", err, sink.canceled, sink.closed)
	}
}

type writeErrSnap struct{}

func (writeErrSnap) WriteTo(io.Writer) (int64, error) {
	return 0, errors.New("disk full")
}
func (writeErrSnap) Release() {}

func TestHCLogAdapter(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHCLogger(base, "raft")
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if l == "" {
				continue
			}
			m := map[string]any{}
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("bad json %q: %v", l, err)
			}
			out = append(out, m)
		}
		buf.Reset()
		return out
	}

	h.Trace("hidden")
	if got := lines(); len(got) != 0 {
		t.Fatalf("trace emitted at debug level: %v", got)
	}
	if !h.IsDebug() || h.IsTrace() || h.GetLevel() != hclog.Debug {
		t.Fatalf("levels: debug=%v trace=%v level=%v", h.IsDebug(), h.IsTrace(), h.GetLevel())
	}

	h.Named("net").With("peer", "n2").Warn("failed to contact", "error", errors.New("boom"),
		"servers", hclog.Fmt("%d/%d", 1, 3), "odd")
	got := lines()
	if len(got) != 1 {
		t.Fatalf("got %d lines", len(got))
	}
	want := map[string]any{"level": "WARN", "msg": "failed to contact", "logger": "raft.net",
		"peer": "n2", "error": "boom", "servers": "1/3", "EXTRA_VALUE_AT_END": "odd"}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %v, want %v (line %v)", k, got[0][k], v, got[0])
		}
	}

	tests := []struct {
		level hclog.Level
		want  string
	}{{hclog.Debug, "DEBUG"}, {hclog.Info, "INFO"}, {hclog.Warn, "WARN"}, {hclog.Error, "ERROR"}}
	for _, tt := range tests {
		h.Log(tt.level, "m")
		if l := lines(); len(l) != 1 || l[0]["level"] != tt.want {
			t.Errorf("level %v -> %v, want %s", tt.level, l, tt.want)
		}
	}

	// Routine raft errors are demoted.
	h.Error("failed to appendEntries to", "peer", "n3")
	if l := lines(); len(l) != 1 || l[0]["level"] != "WARN" {
		t.Errorf("demoted message: %v", l)
	}

	std := h.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	std.Print("[ERR] something broke")
	l := lines()
	if len(l) != 1 || l[0]["level"] != "ERROR" || l[0]["msg"] != "something broke" {
		t.Fatalf("standard logger line %v", l)
	}
	if h.Name() != "raft" || h.ResetNamed("x").Name() != "x" || len(h.With("a", 1).ImpliedArgs()) != 2 {
		t.Fatal("names / implied args")
	}
}

func TestConfigValidation(t *testing.T) {
	base := Config{ID: "a", RaftAddr: "127.0.0.1:0", DataDir: "/tmp/x"}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no id", func(c *Config) { c.ID = "" }, "ID is required"},
		{"no dir", func(c *Config) { c.DataDir = "" }, "DataDir is required"},
		{"no addr", func(c *Config) { c.RaftAddr = "" }, "RaftAddr or Listener"},
		{"peer without address", func(c *Config) { c.Peers = []Server{{ID: "a"}} }, "Peers[0]"},
		{"duplicate peer id", func(c *Config) {
			c.Peers = []Server{{ID: "a", Address: "h:1"}, {ID: "a", Address: "h:2"}}
		}, "duplicate ID"},
		{"duplicate peer address", func(c *Config) {
			c.Peers = []Server{{ID: "a", Address: "h:1"}, {ID: "b", Address: "h:1"}}
		}, "duplicate Address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.mod(&c)
			_, err := c.withDefaults()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	c, err := base.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxAppendEntries != DefaultMaxAppendEntries || c.HeartbeatTimeout != DefaultHeartbeatTimeout ||
		c.LeaderLeaseTimeout != DefaultLeaderLeaseTimeout || c.ElectionTimeout != DefaultElectionTimeout {
		t.Fatalf("defaults %+v", c)
	}
	if err := raft.ValidateConfig(c.raftConfig(nil)); err != nil {
		t.Fatalf("default raft config invalid: %v", err)
	}
	fast := base
	fast.HeartbeatTimeout = 100e6
	fast, _ = fast.withDefaults()
	if err := raft.ValidateConfig(fast.raftConfig(nil)); err != nil {
		t.Fatalf("derived timeouts invalid: %v", err)
	}
}

func TestOpenRejectsBadAddresses(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"wildcard", Config{ID: "a", RaftAddr: "0.0.0.0:0"}, "explicit host"},
		{"empty host", Config{ID: "a", RaftAddr: ":0"}, "explicit host"},
		{"peer address mismatch", Config{ID: "a", RaftAddr: "127.0.0.1:0",
			Peers: []Server{{ID: "a", Address: "127.0.0.1:1"}, {ID: "b", Address: "127.0.0.1:2"}}}, "advertises"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.DataDir = t.TempDir()
			n, err := Open(context.Background(), tt.cfg, newTestSM())
			if err == nil {
				_ = n.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	// A failed Open releases the data dir: the same dir opens fine.
	dir := t.TempDir()
	bad := Config{ID: "a", RaftAddr: "127.0.0.1:0", DataDir: dir, Peers: []Server{{ID: "a", Address: "127.0.0.1:1"}}}
	if _, err := Open(context.Background(), bad, newTestSM()); err == nil {
		t.Fatal("Open succeeded")
	}
	n, err := Open(context.Background(), Config{ID: "a", RaftAddr: "127.0.0.1:0", DataDir: dir}, newTestSM())
	if err != nil {
		t.Fatalf("reopen after failed Open: %v", err)
	}
	_ = n.Close()
}

func TestApplyErrorMapping(t *testing.T) {
	n := &Node{}
	tests := []struct {
		in      error
		reason  string
		is      []error
		isNot   []error
		comment string
	}{
		{raft.ErrNotLeader, reasonNotLeader, []error{ErrNotLeader, raft.ErrNotLeader}, []error{ErrUnknownOutcome}, ""},
		{raft.ErrLeadershipTransferInProgress, reasonNotLeader, []error{ErrNotLeader}, []error{ErrUnknownOutcome}, ""},
		{raft.ErrLeadershipLost, reasonLeadershipLost, []error{ErrLeadershipLost, ErrUnknownOutcome, raft.ErrLeadershipLost}, []error{ErrNotLeader}, ""},
		{raft.ErrEnqueueTimeout, reasonNotSubmitted, []error{context.DeadlineExceeded}, []error{ErrUnknownOutcome}, ""},
		{raft.ErrRaftShutdown, reasonClosed, []error{ErrClosed}, []error{ErrUnknownOutcome}, ""},
		{errors.New("disk"), reasonOther, nil, []error{ErrNotLeader, ErrUnknownOutcome}, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in), func(t *testing.T) {
			reason, err := n.applyErr(tt.in)
			if reason != tt.reason {
				t.Errorf("reason %q, want %q", reason, tt.reason)
			}
			for _, e := range tt.is {
				if !errors.Is(err, e) {
					t.Errorf("%v is not %v", err, e)
				}
			}
			for _, e := range tt.isNot {
				if errors.Is(err, e) {
					t.Errorf("%v is %v", err, e)
				}
			}
		})
	}
}
