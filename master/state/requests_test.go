package state

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// A request id names one request: reusing it for another command or another
// body is refused, and nothing changes.
func TestRequestIDReusedForAnotherCommandIsRefused(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	reg := command{Op: opRegister, RequestID: "r1", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}}
	if res := h.apply(reg); res.Err != nil {
		t.Fatal(res.Err)
	}
	before, _, _ := h.table.StateJSON("")
	tests := []struct {
		name string
		cmd  command
	}{
		{"delete", command{Op: opDelete, RequestID: "r1", Delete: &deleteCmd{Agents: []string{"a1"}}}},
		{"register of another agent", command{Op: opRegister, RequestID: "r1", Register: &registerCmd{AgentID: "a2", IP: "198.18.0.2"}}},
		{"register with another body", command{Op: opRegister, RequestID: "r1", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.9"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := h.apply(tt.cmd)
			if res.Err == nil || !strings.Contains(res.Err.Error(), "request_id") {
				t.Errorf("reused request id: err %v, deleted %v, agent %+v; want an error naming request_id", res.Err, res.Deleted, res.Agent)
			}
			if after, _, _ := h.table.StateJSON(""); !bytes.Equal(before, after) {
				t.Errorf("the refused command changed the state:\n%s\n%s", before, after)
			}
		})
	}
	// The request itself, retried, is still answered.
	if res := h.apply(reg); res.Err != nil || res.Agent == nil || res.Agent.AgentID != "a1" {
		t.Errorf("retry of the request itself: %+v %v", res.Agent, res.Err)
	}
}

// The answer to a retried request describes that request's own effect, not
// what other clients did to the agent since.
func TestRetriedRequestAnswersItsOwnOutcome(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	reg := command{Op: opRegister, RequestID: "r1", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}}
	first := h.apply(reg)
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	// Deleted by an operator: the retry still learns what its registration did.
	if res := h.apply(command{Op: opDelete, RequestID: "d1", Delete: &deleteCmd{Agents: []string{"a1"}}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if again := h.apply(reg); again.Err != nil || !jsonEqual(again.Agent, first.Agent) {
		t.Errorf("retry after the delete: %+v %v, want the first answer %+v", again.Agent, again.Err, first.Agent)
	}
	// Another client takes the freed leases, then a1 registers again with
	// other leases: the retry of r1 still answers r1's leases.
	h.mustRegister("a2", "198.18.0.2")
	if res := h.apply(command{Op: opRegister, RequestID: "r2", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	again := h.apply(reg)
	if again.Err != nil || !jsonEqual(again.Agent, first.Agent) {
		t.Errorf("retry after a re-registration:\n got %+v %v\nwant %+v", again.Agent, again.Err, first.Agent)
	}
	// The delete's retry answers its own effect too.
	if res := h.apply(command{Op: opDelete, RequestID: "d1", Delete: &deleteCmd{Agents: []string{"a1"}}}); res.Err != nil || fmt.Sprint(res.Deleted) != "[a1]" {
		t.Errorf("retry of the delete: deleted %v, %v", res.Deleted, res.Err)
	}
	if _, ok := h.table.Agent("a1"); !ok {
		t.Errorf("the retried delete deleted a1 a second time")
	}
}

// Outcomes survive a snapshot: a retry after a restore is answered the same.
func TestRequestOutcomesSurviveSnapshot(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	reg := command{Op: opRegister, RequestID: "r1", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}}
	first := h.apply(reg)
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a1"}}})
	h.mustRegister("a2", "198.18.0.2")
	h.apply(command{Op: opRegister, RequestID: "r2", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}})
	h.apply(command{Op: opRegister, RequestID: "r3", Register: &registerCmd{AgentID: "a3", IP: "198.18.0.3", Hostname: "h3"}})

	restored := restoreCopy(t, h)
	h2 := &tableHarness{t: t, table: restored, index: h.index}
	for _, hh := range []*tableHarness{h, h2} {
		if again := hh.apply(reg); again.Err != nil || !jsonEqual(again.Agent, first.Agent) {
			t.Errorf("retry of r1: %+v %v, want %+v", again.Agent, again.Err, first.Agent)
		}
		if res := hh.apply(command{Op: opDelete, RequestID: "r3", Delete: &deleteCmd{Agents: []string{"a3"}}}); res.Err == nil {
			t.Errorf("reuse of r3 for a delete was not refused")
		}
	}
	want, _, _ := h.table.StateJSON("")
	got, _, _ := restored.StateJSON("")
	if !bytes.Equal(want, got) {
		t.Fatalf("after restore, the same commands gave different states:\n%s\n%s", want, got)
	}
}

// restoreCopy snapshots h's table and restores the snapshot into a new one.
func restoreCopy(t *testing.T, h *tableHarness) *LeaseTable {
	t.Helper()
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
	return restored
}
