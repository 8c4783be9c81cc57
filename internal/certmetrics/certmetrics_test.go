package certmetrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
)

// The gauge shows the certificate (by role/name) and the CA with the
// seconds left; files that cannot be read are left out.
func TestExpiry(t *testing.T) {
	ca := pkitest.New(t) // a CA of one day; certificates of a year
	files := ca.Files("m1", pki.RoleMaster)
	tests := []struct {
		name  string
		files pki.Files
		want  map[string][2]float64 // label -> [min, max] seconds
	}{
		{"both", files, map[string][2]float64{"master/m1": {360 * 86400, 366 * 86400}, "ca": {22 * 3600, 25 * 3600}}},
		{"no CA file", pki.Files{Cert: files.Cert}, map[string][2]float64{"master/m1": {360 * 86400, 366 * 86400}}},
		{"unreadable", pki.Files{CA: "/nonexistent", Cert: "/nonexistent"}, map[string][2]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(New(tt.files))
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, mf := range mfs {
				n += len(mf.GetMetric())
				for _, m := range mf.GetMetric() {
					label := m.GetLabel()[0].GetValue()
					v := m.GetGauge().GetValue()
					if r, ok := tt.want[label]; !ok || v < r[0] || v > r[1] {
						t.Errorf("cert=%q: %v seconds, want within %v", label, v, r)
					}
				}
			}
			if n != len(tt.want) {
				t.Errorf("%d series, want %d", n, len(tt.want))
			}
		})
	}
}
