package dockeripam_test

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
)

var fuzzPaths = []string{
	"/Plugin.Activate",
	"/IpamDriver.GetCapabilities",
	"/IpamDriver.GetDefaultAddressSpaces",
	"/IpamDriver.RequestPool",
	"/IpamDriver.ReleasePool",
	"/IpamDriver.RequestAddress",
	"/IpamDriver.ReleaseAddress",
}

// FuzzPluginRequest feeds Docker's (remote) request bodies to every endpoint:
// no panic, every answer is JSON, failures are {"Err": ...} with a non-200
// status, and an address handed out is inside a docker range.
func FuzzPluginRequest(f *testing.F) {
	for i, body := range []string{
		`null`, ``, `{`, `[]`, `"x"`,
		`{"AddressSpace":"CarveLocal","Pool":"","SubPool":"","Options":{"network":"carve"},"V6":false}`,
		`{"Options":{"network":"carve"},"V6":true}`,
		`{"Pool":"10.128.0.128/25","Options":{"network":"carve"}}`,
		`{"PoolID":"carve/carve/4/10.128.0.128/25","Address":"","Options":null}`,
		`{"PoolID":"carve/carve/4/10.128.0.128/25","Address":"10.128.0.129","Options":{"RequestAddressType":"com.docker.network.gateway"}}`,
		`{"PoolID":"carve/carve/6/fd00:ca7e:0:0:8000::/65","Address":"fd00:ca7e::8000:0:0:5"}`,
		`{"PoolID":"carve/carve/4/10.128.0.128/25","Options":{"com.docker.network.endpoint.macaddress":"02:42:ac:11:00:02"}}`,
		`{"PoolID":"carve/carve/4/10.128.0.128/25","Address":"10.128.0.130"}`,
		`{"PoolID":"carve/carve/4/10.128.0.128/25","Address":"10.128.0.130/25"}`,
		`{"PoolID":"carve//4/","Address":"::ffff:10.128.0.130"}`,
		`{"PoolID":"carve/carve/4/10.128.0.128/25","Address":"fe80::1%eth0"}`,
	} {
		f.Add(uint8(i), []byte(body))
	}
	f.Fuzz(func(t *testing.T, endpoint uint8, body []byte) {
		svc := newTestService(t)
		s, err := dockeripam.New(svc, dockeripam.Options{PluginSocket: "/nonexistent/carve.sock", Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		path := fuzzPaths[int(endpoint)%len(fuzzPaths)]
		code, _, out := pluginCall(t, s.Handler(), path, string(body))
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%s: answer is not a JSON object: %q", path, out)
		}
		if code != http.StatusOK {
			if e, _ := m["Err"].(string); e == "" || len(m) != 1 {
				t.Fatalf("%s: failure %d without an Err: %s", path, code, out)
			}
			return
		}
		if path != "/IpamDriver.RequestAddress" {
			return
		}
		a, err := netip.ParsePrefix(m["Address"].(string))
		if err != nil {
			t.Fatalf("address %q: %v", m["Address"], err)
		}
		inside := false
		for _, ov := range svc.Networks() {
			v4, v6, _ := svc.BridgeSubnets(ov, api.BridgeDocker)
			inside = inside || a == netip.PrefixFrom(a.Addr(), v4.Bits()) && v4.Contains(a.Addr()) ||
				v6.IsValid() && a == netip.PrefixFrom(a.Addr(), v6.Bits()) && v6.Contains(a.Addr())
		}
		if !inside {
			t.Fatalf("handed out %s, outside every docker range", a)
		}
	})
}
