package state

import (
	"bytes"
	"testing"
	"time"

	"github.com/carve-net/carve/master/logcmd"
)

// TestHistory: the table names the Raft log it was applied from (issue
// 27, item 2). A new cluster's history is its cluster id; a restore into
// a running cluster is a command of its log and keeps the history; a
// restore into a table of no cluster (--restore-from onto empty data
// directories: a new log reusing the indexes and terms of the old one)
// names a new one from the cluster id and the restore's epoch, which a
// later online restore keeps, a Raft snapshot carries, and a second
// whole-cluster restore of the same file does not repeat.
func TestHistory(t *testing.T) {
	src := newHarness(t, DefaultConfig())
	if got := src.table.History(); got != "" {
		t.Fatalf("history before the cluster id: %q, want none", got)
	}
	src.apply(command{Op: opSetClusterID, ClusterID: "c1"})
	src.mustRegister("a1", "198.18.0.1")
	var snap bytes.Buffer
	if err := src.table.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	restore := func(h *tableHarness, epoch int64) {
		t.Helper()
		data, err := logcmd.RestoreCommand(snap.Bytes(), time.Unix(0, epoch)).Encode()
		if err != nil {
			t.Fatal(err)
		}
		h.index++
		if res := h.table.Apply(h.index, data).(Result); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	empty := func() *tableHarness { return newHarness(t, DefaultConfig()) }

	tests := []struct {
		name string
		run  func() *tableHarness
		want string
	}{
		{"a new cluster: its cluster id", func() *tableHarness { return src }, "c1"},
		{"an online restore keeps it", func() *tableHarness {
			h := empty()
			h.apply(command{Op: opSetClusterID, ClusterID: "c1"})
			restore(h, 100)
			return h
		}, "c1"},
		{"a whole-cluster restore names a new one", func() *tableHarness {
			h := empty()
			restore(h, 100)
			return h
		}, "c1/100"},
		{"an online restore after it keeps that", func() *tableHarness {
			h := empty()
			restore(h, 100)
			h.mustRegister("a2", "198.18.0.2")
			restore(h, 50) // a clock behind: the epoch is 101
			return h
		}, "c1/100"},
		{"the same file restored whole again: another", func() *tableHarness {
			h := empty()
			restore(h, 200)
			return h
		}, "c1/200"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.run()
			if got := h.table.History(); got != tc.want {
				t.Errorf("history %q, want %q", got, tc.want)
			}
			if got := restoreCopy(t, h).History(); got != tc.want {
				t.Errorf("after a Raft snapshot: history %q, want %q", got, tc.want)
			}
		})
	}
}
