package usage

import (
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
)

func report(stateIndex uint64, free uint64, prefixes ...string) *api.UsageReport {
	r := &api.UsageReport{StateIndex: stateIndex, Overlays: []api.OverlayUsage{{Name: "carve"}}}
	for _, p := range prefixes {
		r.Overlays[0].Blocks = append(r.Overlays[0].Blocks, api.BlockUsage{Prefix: p, Used: 1, Free: free})
	}
	return r
}

func agentInfo(status string, prefixes ...string) *api.AgentInfo {
	ov := api.AgentOverlay{Info: api.OverlayNetwork{Name: "carve"}, State: api.OverlayState{Status: status}}
	for _, p := range prefixes {
		ov.Blocks = append(ov.Blocks, api.Block{Prefix: p})
	}
	return &api.AgentInfo{AgentID: "a1", Overlays: []api.AgentOverlay{ov}}
}

// TestRecordAndFill: the counts an agent reported show on its record's
// blocks, for that record only; the generations change when the counts
// do, and only then.
func TestRecordAndFill(t *testing.T) {
	u := New()
	steps := []struct {
		name    string
		created uint64
		report  *api.UsageReport
		newGen  bool
	}{
		{"first report", 5, report(0, 7, "10.0.0.0/25"), true},
		{"same counts", 5, report(0, 7, "10.0.0.0/25"), false},
		{"other counts", 5, report(0, 6, "10.0.0.0/25"), true},
		{"a new record of the id", 9, report(0, 6, "10.0.0.0/25"), true},
	}
	for _, s := range steps {
		gen, agentGen := u.Generation(), u.AgentGeneration("a1", s.created)
		u.Record("a1", s.created, s.report)
		if changed := u.Generation() != gen; changed != s.newGen {
			t.Errorf("%s: generation changed %v, want %v", s.name, changed, s.newGen)
		}
		if changed := u.AgentGeneration("a1", s.created) != agentGen; changed != s.newGen {
			t.Errorf("%s: agent generation changed %v, want %v", s.name, changed, s.newGen)
		}
	}
	info := agentInfo(api.StatusOK, "10.0.0.0/25", "10.0.0.128/25")
	u.Fill(info, 9)
	if b := info.Overlays[0].Blocks; b[0].Free == nil || *b[0].Free != 6 || b[1].Used != nil {
		t.Errorf("filled blocks %+v", b)
	}
	stale := agentInfo(api.StatusOK, "10.0.0.0/25")
	u.Fill(stale, 5) // the deleted record's
	if stale.Overlays[0].Blocks[0].Free != nil {
		t.Error("the counts of a new record of the id show on an older one")
	}
}

// TestAcknowledge: an acknowledgement only rises for one record, a new
// record's replaces it, and ClearAcks forgets them all.
func TestAcknowledge(t *testing.T) {
	u := New()
	steps := []struct {
		ack  Ack
		want uint64
	}{{Ack{5, 10}, 10}, {Ack{5, 8}, 10}, {Ack{5, 12}, 12}, {Ack{9, 3}, 3}}
	for _, s := range steps {
		if got := u.Acknowledge("a1", s.ack); got != s.want {
			t.Errorf("Acknowledge(%+v) = %d, want %d", s.ack, got, s.want)
		}
	}
	if acks := u.Acks(); len(acks) != 1 || acks["a1"] != (Ack{9, 3}) {
		t.Errorf("acks %+v", acks)
	}
	u.ClearAcks()
	if len(u.Acks()) != 0 {
		t.Error("ClearAcks kept some")
	}
}

// TestFreeIn: judged only when every holder reported for its record.
func TestFreeIn(t *testing.T) {
	u := New()
	u.Record("a1", 1, report(0, 0, "10.0.0.0/25", "fd00::/64"))
	u.Record("a2", 2, report(0, 4, "fd00:0:0:1::/64"))
	tests := []struct {
		name    string
		is4     bool
		holders map[string]uint64
		free    uint64
		full    bool
	}{
		{"no holder", true, nil, 0, false},
		{"one full", true, map[string]uint64{"a1": 1}, 0, true},
		{"one not reported", true, map[string]uint64{"a1": 1, "a3": 3}, 0, false},
		{"an older record's report", true, map[string]uint64{"a1": 7}, 0, false},
		{"v6 free", false, map[string]uint64{"a1": 1, "a2": 2}, 4, false},
	}
	for _, tt := range tests {
		if free, full := u.FreeIn("carve", tt.is4, tt.holders); free != tt.free || full != tt.full {
			t.Errorf("%s: %d %v, want %d %v", tt.name, free, full, tt.free, tt.full)
		}
	}
}

// TestSilence: a silent agent's STATUS_OK overlays show STATUS_FAILED
// saying since when; hearing from it again, or the master no longer
// judging, shows them as reported; each change moves the generations.
func TestSilence(t *testing.T) {
	u := New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	u.Heard("a1", t0)
	if went := u.JudgeSilence([]string{"a1", "a2"}, t0.Add(time.Minute), time.Hour, t0); len(went) != 0 {
		t.Fatalf("silent within the hour: %q", went)
	}
	gen := u.AgentGeneration("a1", 0)
	if went := u.JudgeSilence([]string{"a2", "a1"}, t0.Add(2*time.Hour), time.Hour, t0); strings.Join(went, ",") != "a1,a2" {
		t.Fatalf("went silent %q, want a1,a2", went)
	}
	if u.AgentGeneration("a1", 0) == gen {
		t.Error("going silent left the agent's generation")
	}
	if s := u.SilentAgents(); len(s) != 2 || s[0].LastHeard != "2026-01-01T00:00:00Z" || s[1].LastHeard != "" {
		t.Errorf("silent agents %+v", s)
	}
	info := agentInfo(api.StatusOK)
	u.Fill(info, 0)
	if st := info.Overlays[0].State; st.Status != api.StatusFailed || !strings.Contains(st.Error, "not heard from since 2026-01-01T00:00:00Z") {
		t.Errorf("silent agent shows %+v", st)
	}
	u.Heard("a1", t0.Add(3*time.Hour))
	info = agentInfo(api.StatusOK)
	u.Fill(info, 0)
	if st := info.Overlays[0].State; st.Status != api.StatusOK {
		t.Errorf("heard again, shows %+v", st)
	}
	u.StopJudging()
	if s := u.SilentAgents(); len(s) != 0 {
		t.Errorf("not judging, silent %+v", s)
	}
}

// TestValidate: a usage report's bounds and prefixes are checked, naming
// the field.
func TestValidate(t *testing.T) {
	many := &api.UsageReport{}
	for i := range maxUsageOverlays + 1 {
		many.Overlays = append(many.Overlays, api.OverlayUsage{Name: "o" + string(rune('a'+i%26)) + string(rune('a'+i/26))})
	}
	tests := []struct {
		name string
		r    *api.UsageReport
		want string // "" valid
	}{
		{"valid", report(3, 1, "10.0.0.0/25"), ""},
		{"host bits", report(3, 1, "10.0.0.1/25"), "overlays[0].blocks[0].prefix"},
		{"twice", &api.UsageReport{Overlays: []api.OverlayUsage{{Name: "a"}, {Name: "a"}}}, "overlays[1].name"},
		{"bad name", &api.UsageReport{Overlays: []api.OverlayUsage{{Name: "A"}}}, "overlays[0].name"},
		{"too many overlays", many, "overlays: at most"},
	}
	for _, tt := range tests {
		err := Validate(tt.r)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}
