package capacity

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestFullAndWarn: an overlay is full when its free fraction is low and
// its last IPv4 growth found space nowhere; the WARN says so once, then
// every lowSpaceRepeat, and a growth that worked clears it.
func TestFullAndWarn(t *testing.T) {
	low := Overlay{Name: "carve", Has: [2]bool{true, false}, Used: [2]uint64{95, 0}, Free: [2]uint64{5, 0}}
	var logs bytes.Buffer
	tr := New(func() []Overlay { return []Overlay{low} }, slog.New(slog.NewTextHandler(&logs, nil)))
	warns := func() int { return strings.Count(logs.String(), "running out") }
	t0 := time.Unix(1_700_000_000, 0)
	if tr.Read()[0].Full {
		t.Fatal("full before any growth failed")
	}
	tr.NoteGrowth("carve", false, false, t0) // a growth that failed elsewhere: not full
	if tr.Read()[0].Full {
		t.Fatal("full after a growth failed but not for lack of space")
	}
	tr.NoteGrowth("carve", false, true, t0)
	if !tr.Read()[0].Full {
		t.Fatal("not full after a growth found space nowhere")
	}
	for _, tt := range []struct {
		at   time.Duration
		want int
	}{{0, 1}, {time.Minute, 1}, {lowSpaceRepeat, 2}} {
		tr.WarnLowSpace(t0.Add(tt.at))
		if got := warns(); got != tt.want {
			t.Errorf("at +%v: %d warnings, want %d", tt.at, got, tt.want)
		}
	}
	tr.NoteGrowth("carve", true, false, t0)
	if tr.Read()[0].Full {
		t.Error("still full after a growth worked")
	}
}
