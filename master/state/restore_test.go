package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/master/logcmd"
)

// TestRestoreCommand: a restore replaces the table with the snapshot,
// versions every record at its index, tombstones the agents the snapshot
// lacks, keeps the cluster id and the servers, moves the epoch on (also
// when the clock is behind), survives a Raft snapshot, and the changes
// since an index before it are gone. A snapshot of another cluster is
// refused and changes nothing.
func TestRestoreCommand(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.apply(command{Op: opSetClusterID, ClusterID: "c1"})
	h.apply(command{Op: opServerMeta, ServerMeta: &ServerMeta{ID: "m1", RaftAddr: "198.18.0.1:8300", HTTPAddr: "198.18.0.1:8080"}})
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	var snap bytes.Buffer
	if err := h.table.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	info, err := CheckSnapshot(snap.Bytes())
	if err != nil || info.Agents != 2 || info.ClusterID != "c1" {
		t.Fatalf("CheckSnapshot: %+v, %v", info, err)
	}
	h.mustRegister("a3", "198.18.0.3")
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a1"}}})
	before := h.index

	data, _ := logcmd.RestoreCommand(snap.Bytes(), time.Unix(0, 100)).Encode()
	h.index++
	if res := h.table.Apply(h.index, data).(Result); res.Err != nil {
		t.Fatal(res.Err)
	}
	r := h.index
	st := stateOf(t, h.table)
	if st.Restore == nil || st.Restore.Epoch != 100 || st.Restore.Index != r || st.Restore.From != info.StateIndex || st.ClusterID != "c1" || st.Index != r {
		t.Fatalf("after the restore: restore %+v, cluster %q, index %d", st.Restore, st.ClusterID, st.Index)
	}
	var ids []string
	for _, a := range st.Agents {
		ids = append(ids, a.AgentID)
		if a.Version != r {
			t.Errorf("agent %s at version %d, want %d", a.AgentID, a.Version, r)
		}
	}
	if strings.Join(ids, ",") != "a1,a2" {
		t.Errorf("agents %v, want a1,a2", ids)
	}
	tomb := map[string]uint64{}
	for _, tb := range st.Tombstones {
		tomb[tb.AgentID] = tb.Version
	}
	if tomb["a3"] != r || len(tomb) != 1 {
		t.Errorf("tombstones %v, want a3 at %d", tomb, r)
	}
	if _, ok := h.table.Server("m1"); !ok {
		t.Error("the restore dropped the servers")
	}
	if _, _, err := h.table.ChangesJSON(before); !errors.Is(err, changelog.ErrGone) {
		t.Errorf("changes since %d, before the restore: %v, want gone", before, err)
	}
	if !h.table.AheadOfRestore(r+5) || h.table.AheadOfRestore(r) {
		t.Error("AheadOfRestore")
	}
	// Registrations go on, and a Raft snapshot keeps the restore.
	h.mustRegister("a4", "198.18.0.4")
	if got := stateOf(t, restoreCopy(t, h)).Restore; got == nil || got.Epoch != 100 {
		t.Errorf("a Raft snapshot lost the restore: %+v", got)
	}

	// Again, with a clock behind: the epoch still moves on.
	data, _ = logcmd.RestoreCommand(snap.Bytes(), time.Unix(0, 50)).Encode()
	h.index++
	if res := h.table.Apply(h.index, data).(Result); res.Err != nil {
		t.Fatal(res.Err)
	}
	if e := stateOf(t, h.table).Restore.Epoch; e != 101 {
		t.Errorf("epoch %d after a restore with the clock behind, want 101", e)
	}

	// Another cluster's snapshot.
	other := strings.Replace(snap.String(), `"cluster_id":"c1"`, `"cluster_id":"c2"`, 1)
	data, _ = logcmd.RestoreCommand([]byte(other), time.Now()).Encode()
	h.index++
	idx := h.table.Index()
	if res := h.table.Apply(h.index, data).(Result); !errors.Is(res.Err, ErrBadSnapshot) || !strings.Contains(res.Err.Error(), "of cluster c2, this cluster is c1") {
		t.Errorf("restore of another cluster's snapshot: %v", res.Err)
	}
	if st := stateOf(t, h.table); st.ClusterID != "c1" || len(st.Agents) != 2 || st.Restore.Epoch != 101 || idx > h.table.Index() {
		t.Errorf("the refused restore changed the table: %+v", st)
	}
	for _, bad := range []string{`{}`, `{"format":3,"agents":[]}`, `nonsense`} {
		if _, err := CheckSnapshot([]byte(bad)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("CheckSnapshot(%s): %v", bad, err)
		}
	}
}

func stateOf(t *testing.T, tbl *LeaseTable) api.State {
	t.Helper()
	data, _, err := tbl.StateJSON("")
	if err != nil {
		t.Fatal(err)
	}
	var st api.State
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A restore never takes a revocation back: restored from a snapshot taken
// before h1's certificate was revoked, the deny list keeps it and h1's
// record, which the snapshot holds, stays deleted.
func TestRestoreKeepsRevocations(t *testing.T) {
	h, snap := twoAgentsSaved(t)
	c, err := logcmd.RevokeCommand(api.RevokeRequest{Serial: "0a", Identity: "agent/h1"})
	if err != nil {
		t.Fatal(err)
	}
	if res := h.apply(c); res.Err != nil {
		t.Fatal(res.Err)
	}
	h.mustRestore(snap)
	if !h.table.IsRevoked("a") {
		t.Errorf("the restore took the revocation back: %+v", h.table.Revoked())
	}
	st := stateOf(t, h.table)
	for _, a := range st.Agents {
		if a.AgentID == "h1" {
			t.Errorf("the revoked agent's record came back with the snapshot: %+v", a)
		}
	}
	tomb := map[string]bool{}
	for _, tb := range st.Tombstones {
		tomb[tb.AgentID] = true
	}
	if !tomb["h1"] || len(st.Agents) != 1 {
		t.Errorf("agents %d, tombstones %v: want h2 alone and h1 tombstoned", len(st.Agents), tomb)
	}
	// h1's space is quarantined, as its revocation left it: h2 may hold
	// an unreported grant of h1's, so a new agent is not leased it.
	var h1Blocks []string
	for _, q := range st.Quarantine {
		if q.From == "h1" {
			h1Blocks = append(h1Blocks, q.Prefix)
		}
	}
	if len(h1Blocks) == 0 {
		t.Fatalf("the revoked agent's blocks were freed by the restore, not quarantined: quarantine %+v", st.Quarantine)
	}
	h.mustRegister("h3", "198.18.0.3")
	for _, a := range stateOf(t, h.table).Agents {
		if a.AgentID != "h3" {
			continue
		}
		for _, o := range a.Overlays {
			for _, q := range h1Blocks {
				if overlaps(t, o.Subnet, q) {
					t.Errorf("h3 was leased %s, inside the revoked h1's quarantined %s", o.Subnet, q)
				}
			}
		}
	}
}

// overlaps reports whether the prefixes a and b overlap.
func overlaps(t *testing.T, a, b string) bool {
	t.Helper()
	pa, err := netip.ParsePrefix(a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := netip.ParsePrefix(b)
	if err != nil {
		t.Fatal(err)
	}
	return pa.Overlaps(pb)
}

// TestRestoreQuarantinesTheAgentsItDeletes: an agent registered after the
// snapshot is deleted by the restore, and so is the quarantine of one
// deleted after it. Their space is quarantined as a delete command's is,
// not freed: a live agent may hold an unreported grant of theirs. A new
// agent is not leased it, and the agent registering again gets its own
// subnet back (its containers keep their addresses).
func TestRestoreQuarantinesTheAgentsItDeletes(t *testing.T) {
	h, snap := twoAgentsSaved(t)
	late := h.mustRegister("late", "198.18.0.3").Overlays[0].Subnet
	gone := h.mustRegister("gone", "198.18.0.4").Overlays[0].Subnet
	if res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"gone"}}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	h.mustRestore(snap)
	quarantined := map[string][]string{}
	for _, q := range stateOf(t, h.table).Quarantine {
		quarantined[q.From] = append(quarantined[q.From], q.Prefix)
	}
	for id, subnet := range map[string]string{"late": late, "gone": gone} {
		var in bool
		for _, q := range quarantined[id] {
			in = in || overlaps(t, q, subnet)
		}
		if !in {
			t.Errorf("the restore freed %s of %s, deleted by it: quarantine %v", subnet, id, quarantined)
		}
	}
	fresh := h.mustRegister("fresh", "198.18.0.5").Overlays[0].Subnet
	if overlaps(t, fresh, late) || overlaps(t, fresh, gone) {
		t.Errorf("a new agent was leased %s, inside the quarantined %s or %s", fresh, late, gone)
	}
	if again := h.mustRegister("late", "198.18.0.3").Overlays[0].Subnet; again != late {
		t.Errorf("late registered again after the restore got %s, want its own %s back", again, late)
	}
}

// twoAgentsSaved is a table of cluster c1 with agents h1 and h2, and its
// snapshot.
func twoAgentsSaved(t *testing.T) (*tableHarness, []byte) {
	t.Helper()
	h := newHarness(t, DefaultConfig())
	h.apply(command{Op: opSetClusterID, ClusterID: "c1"})
	h.mustRegister("h1", "198.18.0.1")
	h.mustRegister("h2", "198.18.0.2")
	var snap bytes.Buffer
	if err := h.table.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	return h, snap.Bytes()
}

// mustRestore applies the restore of snap into the running table.
func (h *tableHarness) mustRestore(snap []byte) {
	h.t.Helper()
	data, err := logcmd.RestoreCommand(snap, time.Unix(0, 100)).Encode()
	if err != nil {
		h.t.Fatal(err)
	}
	h.index++
	if res := h.table.Apply(h.index, data).(Result); res.Err != nil {
		h.t.Fatal(res.Err)
	}
}

// TestRestoreOfAnEarlierReleaseReplaysAsItWasApplied: a restore entry of
// v0.4's log (no quarantine) frees the space of the agents it deletes, as
// masters of v0.4 applied it, so that a master replaying that log holds
// the table the others hold.
func TestRestoreOfAnEarlierReleaseReplaysAsItWasApplied(t *testing.T) {
	h, snap := twoAgentsSaved(t)
	h.mustRegister("late", "198.18.0.3")
	if res := h.apply(command{Op: opRestore, Restore: &restoreCmd{Epoch: 100, Snapshot: snap}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if q := stateOf(t, h.table).Quarantine; len(q) != 0 {
		t.Errorf("a restore entry of v0.4 quarantined %+v: replicas replaying that log would differ from those that applied it", q)
	}
}

// TestRestoreQuarantineTakesOverAnOlderOne: the snapshot quarantines a's
// space; after it a's quarantine was released and e was leased that space,
// and the restore deletes e. e's claim takes that quarantine over: a live
// agent may hold an unreported grant of e's there, so a, registering again,
// must not take it back as its own.
func TestRestoreQuarantineTakesOverAnOlderOne(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.apply(command{Op: opSetClusterID, ClusterID: "c1"})
	h.mustRegister("h1", "198.18.0.1")
	old := h.mustRegister("a", "198.18.0.2").Overlays[0].Subnet
	if res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a"}}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	var snap bytes.Buffer
	if err := h.table.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if res := h.releaseAll(); res.Released == 0 {
		t.Fatal("a's quarantine was not released")
	}
	if got := h.mustRegister("e", "198.18.0.3").Overlays[0].Subnet; got != old {
		t.Fatalf("e was leased %s, want a's released %s", got, old)
	}
	h.mustRestore(snap.Bytes())
	for _, q := range stateOf(t, h.table).Quarantine {
		if overlaps(t, q.Prefix, old) && q.From != "e" {
			t.Errorf("after the restore %s is quarantined as %s's, want e's (the newer claim): %+v", q.Prefix, q.From, q)
		}
	}
	if again := h.mustRegister("a", "198.18.0.2").Overlays[0].Subnet; overlaps(t, again, old) {
		t.Errorf("a registering again took back %s, where e (deleted by the restore) may have granted space unreported", again)
	}
}
