package snapshot

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
)

// TestCheckFormat: the versions from FormatLegacy to Format are read,
// others refused with an error naming both.
func TestCheckFormat(t *testing.T) {
	tests := []struct {
		format int
		ok     bool
	}{{0, false}, {FormatLegacy, true}, {2, true}, {Format, true}, {Format + 1, false}, {-1, false}}
	for _, tt := range tests {
		err := (&Data{Format: tt.format}).CheckFormat()
		if (err == nil) != tt.ok {
			t.Errorf("format %d: %v, want ok %v", tt.format, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "reads 1 to 3") {
			t.Errorf("format %d: %v does not name the versions read", tt.format, err)
		}
	}
}

// TestAgentRecord: a record goes into a snapshot and comes back equal; a
// snapshot's agent without leases gets an empty map (the table adds to
// it).
func TestAgentRecord(t *testing.T) {
	p := netip.MustParsePrefix("10.1.0.0/24")
	rec := &record.Agent{ID: "a1", Hostname: "h", IP: netip.MustParseAddr("198.18.0.1"), MeshAddr: "198.18.0.1:6783",
		Bridges: api.AgentNetworkConfig{MesosBridge: true}, Keys: api.AgentKeys{WireGuard: "wg"}, UnderlayMTU: 1500,
		VTEP: netip.MustParseAddr("100.64.0.1"), VTEP6: netip.MustParseAddr("fd01::1"), Version: 7, Created: 3, CarveVersion: "v1",
		Leases: map[string]record.Lease{"o": {Subnet: p, Blocks: []record.Block{{Bridge: api.BridgeMesos, Prefix: p, Origin: api.BlockLeased, Home: p, Version: 3}}}}}
	if back := AgentOf(rec).Record(); !back.Equal(rec) {
		t.Errorf("record through a snapshot:\n got %+v\nwant %+v", back, rec)
	}
	if back := (Agent{ID: "a2"}).Record(); back.Leases == nil {
		t.Errorf("an agent without leases came back with a nil map")
	}
}

// TestWriteReadsBack: what Write writes is one JSON line that decodes to
// the same data, with the field names of the format.
func TestWriteReadsBack(t *testing.T) {
	d := Data{Format: Format, Index: 9, StateIndex: 8, ClusterID: "c1", Tombstones: map[string]uint64{"gone": 5},
		Agents:     []Agent{{ID: "a1", VTEP: netip.MustParseAddr("100.64.0.1"), Version: 4}},
		Quarantine: map[string][]Quarantined{"o": {{Prefix: netip.MustParsePrefix("10.1.1.0/24"), From: "gone", Since: 5}}},
		Marks:      []ClockMark{{Index: 6, Time: 1000}}}
	var buf bytes.Buffer
	if _, err := Write(&buf, &d); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.HasSuffix(buf.String(), "\n") {
		t.Errorf("snapshot is not one line: %q", buf.String())
	}
	for _, field := range []string{`"format":3`, `"state_index":8`, `"quarantine":{"o":[{"prefix":"10.1.1.0/24","from":"gone","since":5}]}`, `"marks":[{"index":6,"time":1000}]`} {
		if !strings.Contains(buf.String(), field) {
			t.Errorf("snapshot lacks %s: %s", field, buf.String())
		}
	}
	var back Data
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.StateIndex != d.StateIndex || len(back.Agents) != 1 || back.Agents[0].VTEP != d.Agents[0].VTEP || back.Quarantine["o"][0] != d.Quarantine["o"][0] {
		t.Errorf("read back %+v, wrote %+v", back, d)
	}
}
