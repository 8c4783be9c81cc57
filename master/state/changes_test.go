package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/changelog"
)

// changesOf decodes the table's changes since index.
func changesOf(t *testing.T, table *LeaseTable, since uint64) (*api.Changes, error) {
	t.Helper()
	data, index, err := table.ChangesJSON(since)
	if err != nil {
		return nil, err
	}
	var ch api.Changes
	if err := api.DecodeStrict(bytes.NewReader(data), &ch); err != nil {
		t.Fatalf("changes since %d: %v\n%s", since, err, data)
	}
	if ch.Index != index || ch.Since != since {
		t.Fatalf("changes since %d: index %d since %d, header index %d", since, ch.Index, ch.Since, index)
	}
	return &ch, nil
}

func changedIDs(ch *api.Changes) (agents, tombstones []string) {
	for _, a := range ch.Agents {
		agents = append(agents, a.AgentID)
	}
	for _, tb := range ch.Tombstones {
		tombstones = append(tombstones, tb.AgentID)
	}
	return agents, tombstones
}

// TestChangesHoldOnlyWhatChanged: the changes since an index hold the
// records and tombstones changed after it (an IP taken over changes the
// older agent too), the network only when the configuration changed, and
// every record exactly as the state shows it.
func TestChangesHoldOnlyWhatChanged(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.mustRegister("a", "198.18.0.1")
	h.mustRegister("b", "198.18.0.2")
	afterB := h.table.Index()
	h.mustRegister("c", "198.18.0.3")
	afterC := h.table.Index()
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"b"}}})
	afterDelete := h.table.Index()
	h.mustRegister("d", "198.18.0.1") // takes a's IP: a changes too

	tests := []struct {
		since            uint64
		agents, tombs    []string
		network          bool
		wantGoneOrLonger bool
	}{
		{since: 0, agents: []string{"a", "c", "d"}, tombs: []string{"b"}, network: true},
		{since: afterB, agents: []string{"a", "c", "d"}, tombs: []string{"b"}},
		{since: afterC, agents: []string{"a", "d"}, tombs: []string{"b"}},
		{since: afterDelete, agents: []string{"a", "d"}},
		{since: h.table.Index()},
	}
	st := h.table.State()
	byID := map[string]api.AgentInfo{}
	for _, a := range st.Agents {
		byID[a.AgentID] = a
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("since ", tt.since), func(t *testing.T) {
			ch, err := changesOf(t, h.table, tt.since)
			if err != nil {
				t.Fatal(err)
			}
			agents, tombs := changedIDs(ch)
			if !slices.Equal(agents, tt.agents) || !slices.Equal(tombs, tt.tombs) || (ch.Network != nil) != tt.network {
				t.Fatalf("agents %v tombstones %v network %v, want %v %v %v", agents, tombs, ch.Network != nil, tt.agents, tt.tombs, tt.network)
			}
			if ch.Index != st.Index {
				t.Fatalf("index %d, want the state's %d", ch.Index, st.Index)
			}
			for _, a := range ch.Agents {
				want, _ := json.Marshal(byID[a.AgentID])
				got, _ := json.Marshal(a)
				if !bytes.Equal(got, want) {
					t.Fatalf("record of %s differs from the state's:\n%s\n%s", a.AgentID, got, want)
				}
			}
		})
	}
}

// TestChangeLogBoundAndRestore: the change log is bounded; changes since an
// index it no longer covers are gone with the oldest index served, which
// itself is served. After a snapshot restore the log starts at the
// snapshot's state index.
func TestChangeLogBoundAndRestore(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.table.SetChangeLogIDs(8)
	for i := range 20 {
		h.mustRegister(fmt.Sprintf("a%d", i), fmt.Sprintf("198.18.1.%d", i+1))
	}
	_, err := changesOf(t, h.table, 1)
	var gone *changelog.GoneError
	if !errors.As(err, &gone) || gone.Oldest <= 1 || !errors.Is(err, changelog.ErrGone) {
		t.Fatalf("changes since 1 with a log of 8 after 20 registrations: %v, want gone", err)
	}
	ch, err := changesOf(t, h.table, gone.Oldest)
	if err != nil {
		t.Fatalf("changes since the oldest served (%d): %v", gone.Oldest, err)
	}
	if n := len(ch.Agents); n == 0 || n > 8 || uint64(n) != h.table.Index()-gone.Oldest {
		t.Fatalf("%d agents since %d at index %d", n, gone.Oldest, h.table.Index())
	}

	snap, err := h.table.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	restored := NewLeaseTable()
	if err := restored.Restore(h.index, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := changesOf(t, restored, h.table.Index()-1); !errors.As(err, &gone) || gone.Oldest != h.table.Index() {
		t.Fatalf("restored: changes since %d: %v, want gone with oldest %d", h.table.Index()-1, err, h.table.Index())
	}
	if ch, err := changesOf(t, restored, h.table.Index()); err != nil || len(ch.Agents) != 0 {
		t.Fatalf("restored: changes since the snapshot: %+v %v", ch, err)
	}
}

// TestCompaction: a compaction command drops the tombstones at or below
// the newest clock mark older than its max age, by the clock written in
// the commands (never the replica's): two tables applying the same log end
// the same. The horizon is in the state and survives a snapshot; changes
// since below it are gone.
func TestCompaction(t *testing.T) {
	run := func(t *testing.T) *tableHarness {
		h := newHarness(t, DefaultConfig())
		h.mustRegister("old", "198.18.0.1")
		h.mustRegister("young", "198.18.0.2")
		h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"old"}}})
		oldTomb, _ := h.table.Tombstone("old")
		h.apply(command{Op: opCompact, Compact: &compactCmd{Now: 10_000, MaxAge: 1000}}) // mark at 10 s: nothing old enough
		if _, ok := h.table.Tombstone("old"); !ok || h.table.Horizon() != 0 {
			t.Fatalf("compacted before any mark was old enough: horizon %d", h.table.Horizon())
		}
		mark := h.index
		h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"young"}}})
		h.apply(command{Op: opCompact, Compact: &compactCmd{Now: 11_500, MaxAge: 1000}})
		if _, ok := h.table.Tombstone("old"); ok {
			t.Fatal("old's tombstone survived a compaction past its age")
		}
		if _, ok := h.table.Tombstone("young"); !ok {
			t.Fatal("young's tombstone, newer than the mark, was compacted")
		}
		if h.table.Horizon() != mark || mark < oldTomb {
			t.Fatalf("horizon %d, want the mark's index %d (old's tombstone at %d)", h.table.Horizon(), mark, oldTomb)
		}
		return h
	}
	a, b := run(t), run(t)
	if sa, sb := a.table.State(), b.table.State(); mustJSON(t, sa) != mustJSON(t, sb) || sa.Horizon == 0 {
		t.Fatalf("two tables applying one log differ or have no horizon:\n%s\n%s", mustJSON(t, sa), mustJSON(t, sb))
	}
	data, _, err := a.table.StateJSON("")
	if err != nil || !bytes.Contains(data, []byte(fmt.Sprintf(`"horizon":%d`, a.table.Horizon()))) {
		t.Fatalf("the state's JSON lacks the horizon: %s %v", data, err)
	}
	var gone *changelog.GoneError
	if _, err := changesOf(t, a.table, a.table.Horizon()-1); !errors.As(err, &gone) || gone.Oldest != a.table.Horizon() {
		t.Fatalf("changes since below the horizon: %v, want gone with oldest %d", err, a.table.Horizon())
	}
	snap, err := a.table.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	restored := NewLeaseTable()
	if err := restored.Restore(a.index, &buf); err != nil {
		t.Fatal(err)
	}
	if restored.Horizon() != a.table.Horizon() || !slices.Equal(restored.marks, a.table.marks) {
		t.Fatalf("restored horizon %d marks %v, want %d %v", restored.Horizon(), restored.marks, a.table.Horizon(), a.table.marks)
	}
}
