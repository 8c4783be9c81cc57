package state

import (
	"reflect"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
)

// TestNoteCA: the certificate an agent presents counts by the newest
// one seen (an agent reloaded with a new certificate may still present
// its old one on a connection opened before), an older one only once the
// newer was not seen for presentedStaleAfter; agents never seen are
// under "", silent ones left out, and deleted ones forgotten.
func TestNoteCA(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	older, newer := t0.Add(-48*time.Hour), t0.Add(-time.Hour)
	type note struct {
		ca        string
		notBefore time.Time
		at        time.Duration
	}
	tests := []struct {
		name  string
		notes []note
		want  string
	}{
		{"never seen", nil, ""},
		{"one certificate", []note{{"old", older, 0}}, "old"},
		{"re-issued", []note{{"old", older, 0}, {"new", newer, time.Second}}, "new"},
		{"the old one on an old connection", []note{{"old", older, 0}, {"new", newer, time.Second}, {"old", older, 2 * time.Second}}, "new"},
		{"the new one still seen", []note{{"new", newer, 0}, {"old", older, presentedStaleAfter}, {"new", newer, presentedStaleAfter}, {"old", older, presentedStaleAfter + time.Minute}}, "new"},
		{"back to the old one", []note{{"new", newer, 0}, {"old", older, time.Second}, {"old", older, presentedStaleAfter + time.Minute}}, "old"},
		{"same NotBefore: the last one", []note{{"old", newer, 0}, {"new", newer, time.Second}}, "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, DefaultConfig())
			h.mustRegister("a1", "198.18.0.1")
			for _, n := range tt.notes {
				h.table.NoteCA("a1", n.ca, n.notBefore, t0.Add(n.at))
			}
			want := []api.AgentCA{{CA: tt.want, Count: 1, Agents: []string{"a1"}}}
			if got := h.table.AgentCAs(nil); !reflect.DeepEqual(got, want) {
				t.Errorf("AgentCAs = %+v, want %+v", got, want)
			}
		})
	}
	t.Run("silent left out, deleted forgotten", func(t *testing.T) {
		h := newHarness(t, DefaultConfig())
		for _, id := range []string{"a1", "a2", "a3"} {
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
		h.table.usage.mu.Lock()
		_, kept := h.table.usage.live.cas["a3"]
		h.table.usage.mu.Unlock()
		if kept {
			t.Error("a deleted agent's certificate is still noted")
		}
	})
}
