package usage

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
// under "", and deleted ones forgotten. (master/state's TestAgentCAsLeaveOutSilent
// checks that the table leaves out the silent ones.)
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
			u := New()
			for _, n := range tt.notes {
				u.NoteCA("a1", n.ca, n.notBefore, t0.Add(n.at))
			}
			want := []api.AgentCA{{CA: tt.want, Count: 1, Agents: []string{"a1"}}}
			if got := u.AgentCAs([]string{"a1"}); !reflect.DeepEqual(got, want) {
				t.Errorf("AgentCAs = %+v, want %+v", got, want)
			}
		})
	}
	t.Run("only the agents asked for, deleted forgotten", func(t *testing.T) {
		u := New()
		for _, id := range []string{"a1", "a2", "a3"} {
			u.NoteCA(id, "ca", t0, t0)
		}
		want := []api.AgentCA{{CA: "ca", Count: 2, Agents: []string{"a1", "a3"}}}
		if got := u.AgentCAs([]string{"a1", "a3"}); !reflect.DeepEqual(got, want) {
			t.Errorf("AgentCAs of a1 and a3 = %+v, want %+v", got, want)
		}
		u.JudgeSilence([]string{"a1", "a2"}, t0, time.Hour, t0) // a3 deleted
		u.mu.Lock()
		_, kept := u.live.cas["a3"]
		u.mu.Unlock()
		if kept {
			t.Error("a deleted agent's certificate is still noted")
		}
	})
}
