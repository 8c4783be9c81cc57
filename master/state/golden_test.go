package state

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/golden-table.json (only for a deliberate format change)")

// goldenTable is what the golden file holds: by name, the bytes the table
// wrote, as text.
type goldenTable map[string]string

// TestGoldenTableBytes: the Raft log entries the commands encode to, the
// snapshot the table writes, the state and the changes it serves (signed,
// with usage counts and a silent agent) and its state digest are byte for
// byte those of testdata/golden-table.json, written by master/state at
// 9f03860, before the network configuration, the record signer and the
// usage accounting moved out of it (issue 30). A difference is a change of
// the wire or disk formats or of what replicas compute: masters of mixed
// versions would disagree, and the snapshots they exchange would differ.
func TestGoldenTableBytes(t *testing.T) {
	got := goldenRun(t)
	if *updateGolden {
		b, err := json.MarshalIndent(got, "", "\t")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("testdata/golden-table.json", append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile("testdata/golden-table.json")
	if err != nil {
		t.Fatal(err)
	}
	var want goldenTable
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if got[name] != want[name] {
			t.Errorf("%s differs from the golden bytes:\n got %s\nwant %s", name, got[name], want[name])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d golden entries made, the file holds %d", len(got), len(want))
	}
}

// goldenRun drives a table through a fixed history with the exported
// commands (a configuration with IPv4 and IPv6 overlays and VTEPs, agents
// that register, report, grow, grant and are deleted into quarantine, a
// revocation, a compaction) and collects what it writes.
func goldenRun(t *testing.T) goldenTable {
	t.Helper()
	seed := sha256.Sum256([]byte("golden record-signing key"))
	tbl := NewLeaseTable()
	tbl.SetSigningKey(ed25519.NewKeyFromSeed(seed[:]))
	out := goldenTable{}
	var index uint64
	apply := func(name string, c logcmd.Command, mkErr error) Result {
		t.Helper()
		if mkErr != nil {
			t.Fatalf("%s: %v", name, mkErr)
		}
		entry, err := c.Encode()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out["entry "+name] = string(entry)
		index++
		res := tbl.Apply(index, entry).(Result)
		if res.Err != nil {
			t.Fatalf("%s: %v", name, res.Err)
		}
		return res
	}
	cfg := DefaultConfig()
	cfg.VTEPSubnet6 = "fd01:a::/64"
	cfg.OverlayMTU = 1400
	cfg.Overlays = []api.OverlayNetwork{
		{Name: "carve", Subnet: "10.128.0.0/16", Prefix: 24, GrowPrefix: 26},
		{Name: "six", Subnet: "10.200.0.0/16", Prefix: 24, Subnet6: "fd02::/48", Prefix6: 64},
		{Name: "off", Subnet: "10.201.0.0/16", Prefix: 24, Enabled: new(false)},
	}
	apply("set config", logcmd.SetConfigCommand(cfg), nil)
	apply("cluster id", logcmd.ClusterIDCommand("golden-cluster"), nil)
	apply("server meta", logcmd.ServerMetaCommand(ServerMeta{ID: "m1", RaftAddr: "198.18.0.100:7000", HTTPAddr: "198.18.0.100:7001"}), nil)
	for i, id := range []string{"a1", "a2", "a3"} {
		c, err := logcmd.RegisterCommand(api.RegisterRequest{AgentID: id, IP: "198.18.0." + string(rune('1'+i)), Hostname: "host-" + id,
			MeshAddr: "198.18.0." + string(rune('1'+i)) + ":6783", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: i != 1},
			UnderlayMTU: 1500, CarveVersion: "v0.4.0", RequestID: "reg-" + id})
		apply("register "+id, c, err)
	}
	c, err := logcmd.GrowCommand("a1", api.GrowRequest{Overlay: "carve", Bridge: api.BridgeMesos, Family: "4", RequestID: "grow-a1"})
	apply("grow a1", c, err)
	a2, _ := tbl.Agent("a2")
	give := a2.Overlay("carve").Blocks[0].Prefix
	c, err = logcmd.GrantCommand("a1", api.GrantReport{Overlay: "carve", Prefix: give, Donor: "a2", Recipient: "a1", Bridge: api.BridgeMesos})
	apply("grant a2 to a1", c, err)
	a1, _ := tbl.Agent("a1")
	c, err = logcmd.ReportCommand("a1", api.ReportRequest{Version: a1.Version, ConfigurationAttempts: 1, PeersIndex: index, ProgrammedPeers: new(2),
		Overlays: []api.OverlayReport{{Name: "carve", Status: api.StatusOK}, {Name: "six", Status: api.StatusFailed, Error: "no route"}}})
	apply("report a1", c, err)
	apply("delete a3", logcmd.DeleteAgentCommand("a3"), nil)
	c, err = logcmd.RevokeCommand(api.RevokeRequest{Serial: "0a1b2c", Identity: "operator/alice", NotAfter: 1900000000})
	apply("revoke", c, err)
	apply("compact", logcmd.CompactCommand(time.UnixMilli(1800000000000), time.Hour), nil)

	// What agents tell the leader outside the log shows in the state.
	if _, err := tbl.RecordUsage("a1", &api.UsageReport{Overlays: []api.OverlayUsage{{Name: "carve",
		Blocks: []api.BlockUsage{{Prefix: a1.Overlay("carve").Blocks[0].Prefix, Used: 3, Free: 120}}}}}); err != nil {
		t.Fatal(err)
	}
	since := time.Unix(1800000000, 0)
	tbl.Heard("a1", since)
	tbl.JudgeSilence(since.Add(time.Hour), time.Minute, since)

	var snap bytes.Buffer
	if err := tbl.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	out["snapshot"] = snap.String()
	state, _, err := tbl.StateJSON("m1")
	if err != nil {
		t.Fatal(err)
	}
	out["state"] = string(state)
	changes, _, err := tbl.ChangesJSON(3)
	if err != nil {
		t.Fatal(err)
	}
	out["changes since 3"] = string(changes)
	stateIndex, digest := tbl.StateDigest()
	out["digest"] = digest
	out["digests"] = strings.TrimSpace(string(mustMarshal(t, tbl.StateDigests())))
	out["state index"] = string(mustMarshal(t, stateIndex))

	// Complete usage reports acknowledge the holdings: the leader proposes
	// the release of a3's quarantined space.
	for _, id := range []string{"a1", "a2"} {
		info, _ := tbl.Agent(id)
		var blocks []api.BlockUsage
		for _, b := range info.Overlay("carve").Blocks {
			blocks = append(blocks, api.BlockUsage{Prefix: b.Prefix, Used: 1, Free: 2})
		}
		if ans, err := tbl.RecordUsage(id, &api.UsageReport{StateIndex: index, Overlays: []api.OverlayUsage{{Name: "carve", Blocks: blocks}}}); err != nil || ans.Acknowledged == 0 {
			t.Fatalf("usage of %s: %+v %v", id, ans, err)
		}
	}
	release, ok := tbl.ReleaseProposal()
	if !ok {
		t.Fatal("no release proposed")
	}
	if res := apply("release", release, nil); res.Released == 0 {
		t.Fatal("the release freed nothing")
	}

	// A restore of the snapshot, as carve snapshot restore of v0.4
	// proposed it (no quarantine, which it replays without): the table's
	// restore field is signed.
	apply("restore", logcmd.Command{Op: logcmd.OpRestore, Restore: &logcmd.Restore{Epoch: 1800000000000000000, Snapshot: snap.Bytes()}}, nil)
	state, _, err = tbl.StateJSON("m1")
	if err != nil {
		t.Fatal(err)
	}
	out["state after restore"] = string(state)
	return out
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
