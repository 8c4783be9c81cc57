package state

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/netconfig"
)

// FuzzParseConfig: any input is either refused with an error or gives a
// configuration that validates again and that the lease table applies and
// allocates from without panicking.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"vtep_subnet":"100.64.0.0/30","overlays":[{"name":"a","subnet":"10.0.0.0/29","prefix":30}]}`))
	f.Add([]byte(`{"overlays":[{"name":"dual","subnet":"10.0.0.0/8","prefix":24,"subnet6":"fd00::/8","prefix6":126}]}`))
	f.Add([]byte(`{"vtep_mac_oui":"70:B3:D5:00:00:01"}`))
	f.Add([]byte(`{"overlays":[{"name":"a","subnet":"10.0.0.0/8","prefix":9,"enabled":false}]}`))
	// DC/OS's default configuration, and with dcos-net's VTEP port.
	dcos, err := os.ReadFile("testdata/dcos-default-network.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(dcos)
	f.Add([]byte(strings.Replace(string(dcos), `{"vtep_subnet"`, `{"vtep_port": 64000, "vtep_subnet"`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := netconfig.Parse(data)
		if err != nil {
			return
		}
		again, _ := json.Marshal(cfg)
		if _, err := netconfig.Parse(again); err != nil {
			t.Fatalf("accepted config does not re-validate: %v\n%s", err, again)
		}
		tbl := NewLeaseTable()
		c, _ := encodeCommand(command{Op: opSetConfig, SetConfig: &cfg})
		if res := tbl.Apply(1, c).(Result); res.Err != nil {
			t.Fatalf("valid config refused by the table: %v", res.Err)
		}
		for i := range 3 {
			r, _ := encodeCommand(command{Op: opRegister, Register: &registerCmd{AgentID: string(rune('a' + i)), IP: "198.18.0.1"}})
			tbl.Apply(uint64(2+i), r)
		}
		if _, _, err := tbl.StateJSON(""); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzRegistrationDecode: the registration decoder and validator never
// panic, and what they accept applies cleanly.
func FuzzRegistrationDecode(f *testing.F) {
	f.Add([]byte(`{"agent_id":"a1","ip":"198.18.0.1","network_config":{"mesos_bridge":true,"docker_bridge":false}}`))
	f.Add([]byte(`{"agent_id":"a1","ip":"fd00::1","mesh_addr":"[fd00::1]:6783"}`))
	f.Add([]byte(`{"agent_id":"","ip":""}`))
	f.Add([]byte(`{"agent_id":"a","ip":"1.2.3.4","extra":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req api.RegisterRequest
		if err := api.DecodeStrict(strings.NewReader(string(data)), &req); err != nil {
			return
		}
		if err := logcmd.ValidateRegistration(&req); err != nil {
			return
		}
		tbl := NewLeaseTable()
		cfg := DefaultConfig()
		c, _ := encodeCommand(command{Op: opSetConfig, SetConfig: &cfg})
		tbl.Apply(1, c)
		r, _ := encodeCommand(command{Op: opRegister, RequestID: req.RequestID, Register: &registerCmd{
			AgentID: req.AgentID, Hostname: req.Hostname, IP: req.IP, MeshAddr: req.MeshAddr, Bridges: req.NetworkConfig}})
		res := tbl.Apply(2, r).(Result)
		if res.Err != nil {
			t.Fatalf("validated registration refused by the table: %v", res.Err)
		}
		if res.Agent.AgentID != req.AgentID {
			t.Fatalf("agent id %q became %q", req.AgentID, res.Agent.AgentID)
		}
	})
}
