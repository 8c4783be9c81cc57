package state

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestSnapshotKeepsReportsAndVTEP6: a format 3 snapshot keeps the IPv6 VTEP
// addresses (and their pool: the next agent gets the next address) and the
// agents' reports; a delete frees the vtep_ip6 and the report; a format 2
// snapshot (before both) restores, with CONFIGURING until agents report.
func TestSnapshotKeepsReportsAndVTEP6(t *testing.T) {
	cfg, err := LoadConfig("testdata/dcos-default-network.json")
	if err != nil {
		t.Fatalf("DC/OS's default configuration refused: %v", err)
	}
	h := newHarness(t, cfg)
	a1 := h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	rep := h.apply(command{Op: opReport, Report: &reportCmd{AgentID: "a1", Report: api.ReportRequest{Version: a1.Version, ConfigurationAttempts: 2,
		Overlays: []api.OverlayReport{{Name: "dcos", Status: api.StatusOK}, {Name: "dcos6", Status: api.StatusFailed, Error: "e"}}}}})
	if rep.Err != nil {
		t.Fatal(rep.Err)
	}
	want, _, _ := h.table.StateJSON("")
	restored := restoreCopy(t, h)
	if got, _, _ := restored.StateJSON(""); string(got) != string(want) {
		t.Fatalf("restored state differs:\n%s\n%s", want, got)
	}
	r := &tableHarness{t: t, table: restored, index: h.index}
	if a3 := r.mustRegister("a3", "198.18.0.3"); a3.Overlay("dcos").Backend.VXLAN.VTEPIP6 != "fd01:a::3/64" {
		t.Errorf("after a restore the next vtep_ip6 is %s, want fd01:a::3/64", a3.Overlay("dcos").Backend.VXLAN.VTEPIP6)
	}
	r.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a1"}}})
	if a4 := r.mustRegister("a1", "198.18.0.4"); a4.Overlay("dcos").Backend.VXLAN.VTEPIP6 != "fd01:a::1/64" || a4.Overlay("dcos").State.Status != api.StatusConfiguring || a4.ConfigurationAttempts != 0 {
		t.Errorf("a deleted agent's vtep_ip6 or report survived: %+v attempts %d", a4.Overlay("dcos"), a4.ConfigurationAttempts)
	}

	format2 := `{"format":2,"index":3,"state_index":3,"cluster_id":"c1",
		"network":{"vtep_subnet":"44.128.0.0/20","vtep_mac_oui":"70:B3:D5:00:00:00","vtep_name":"vtep1024","vni":1024,"vtep_port":4789,"vtep_mtu":1450,"overlay_mtu":1420,"overlays":[{"name":"dcos","subnet":"9.0.0.0/8","prefix":24}]},
		"agents":[{"id":"a1","ip":"198.18.0.1","bridges":{"mesos_bridge":true,"docker_bridge":false},"vtep":"44.128.0.1","leases":{"dcos":{"subnet":"9.0.0.0/24"}},"version":3}],
		"tombstones":{},"servers":{},"requests":[]}`
	tbl := NewLeaseTable()
	if err := tbl.Restore(3, strings.NewReader(format2)); err != nil {
		t.Fatal(err)
	}
	a, ok := tbl.Agent("a1")
	if !ok || a.Overlay("dcos").Subnet != "9.0.0.0/24" || a.Overlay("dcos").State.Status != api.StatusConfiguring || a.Overlay("dcos").Backend.VXLAN.VTEPIP6 != "" {
		t.Errorf("format 2 restore: %+v", a)
	}
	if err := tbl.Restore(3, strings.NewReader(strings.Replace(format2, `"format":2`, `"format":4`, 1))); err == nil {
		t.Error("a format 4 snapshot restored")
	}
}
