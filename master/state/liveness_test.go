package state

import (
	"reflect"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
)

// TestAgentCAsLeaveOutSilent: the table groups its agents, sorted, but
// the silent ones, by the CA their certificates came from; a deleted
// agent's certificate is forgotten at the next judgement.
func TestAgentCAsLeaveOutSilent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newHarness(t, DefaultConfig())
	for _, id := range []string{"a3", "a1", "a2"} {
		h.mustRegister(id, "198.18.0."+id[1:])
		h.table.NoteCA(id, "ca", t0, t0)
	}
	want := []api.AgentCA{{CA: "ca", Count: 2, Agents: []string{"a1", "a3"}}}
	if got := h.table.AgentCAs(map[string]bool{"a2": true}); !reflect.DeepEqual(got, want) {
		t.Errorf("AgentCAs with a2 silent = %+v, want %+v", got, want)
	}
	if res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a3"}}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	h.table.JudgeSilence(t0, time.Hour, t0)
	h.table.NoteCA("a1", "ca", t0, t0)
	want = []api.AgentCA{{CA: "ca", Count: 2, Agents: []string{"a1", "a2"}}}
	if got := h.table.AgentCAs(nil); !reflect.DeepEqual(got, want) {
		t.Errorf("AgentCAs after a3's deletion = %+v, want %+v", got, want)
	}
}
