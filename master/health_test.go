package master

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestDataDirProbe: a probe of a writable dir leaves nothing behind and
// reports nothing; one that cannot write (here: the data dir is a file)
// is reported with the path and the error, the gauge at 0, until a probe
// writes again.
func TestDataDirProbe(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h := newDataDirHealth(prometheus.NewRegistry())
	for _, tc := range []struct {
		name, dir string
		problem   string // a substring of the problem; "" for none
		gauge     float64
	}{
		{"writable", dir, "", 1},
		{"not writable", notDir, "cannot write its --data-dir " + notDir, 0},
		{"writable again", dir, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.record(tc.dir, writeProbe(tc.dir))
			got := h.problem()
			if (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Errorf("problem %q, want one holding %q", got, tc.problem)
			}
			var m dto.Metric
			if err := h.writable.Write(&m); err != nil {
				t.Fatal(err)
			}
			if v := m.GetGauge().GetValue(); v != tc.gauge {
				t.Errorf("carve_master_data_dir_writable %v, want %v", v, tc.gauge)
			}
		})
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
		t.Errorf("the probe left %v in the data dir (%v), want only the test's file", entries, err)
	}
}
