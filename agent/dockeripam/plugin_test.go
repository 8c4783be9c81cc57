package dockeripam_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
)

const gatewayType = "com.docker.network.gateway"

// plugin wraps a handler for the protocol tests.
type plugin struct {
	t *testing.T
	h http.Handler
}

func newPlugin(t *testing.T, svc dockeripam.AddressService) *plugin {
	t.Helper()
	s, err := dockeripam.New(svc, dockeripam.Options{PluginSocket: "/nonexistent/carve.sock", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if s.DriverName() != "carve" {
		t.Fatalf("driver name %q, want carve (the socket's base name)", s.DriverName())
	}
	return &plugin{t: t, h: s.Handler()}
}

// ok makes a call that must succeed and decodes its answer into out.
func (p *plugin) ok(path string, in, out any) string {
	p.t.Helper()
	code, ctype, body := pluginCall(p.t, p.h, path, in)
	if code != http.StatusOK {
		p.t.Fatalf("%s %v: HTTP %d %s", path, in, code, body)
	}
	if ctype != dockeripam.ContentType {
		p.t.Errorf("%s: content type %q", path, ctype)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(body), out); err != nil {
			p.t.Fatalf("%s: %v in %s", path, err, body)
		}
	}
	return body
}

// fail makes a call that must fail as Docker reads failures: a non-200
// status with {"Err": msg}. It returns msg.
func (p *plugin) fail(path string, in any) string {
	p.t.Helper()
	code, ctype, body := pluginCall(p.t, p.h, path, in)
	if code == http.StatusOK {
		p.t.Fatalf("%s %v: succeeded with %s", path, in, body)
	}
	if ctype != dockeripam.ContentType {
		p.t.Errorf("%s: content type %q", path, ctype)
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(body), &m); err != nil || len(m) != 1 || m["Err"] == "" {
		p.t.Fatalf("%s: error body %s, want exactly {\"Err\": \"...\"}", path, body)
	}
	return m["Err"]
}

type poolAnswer struct {
	PoolID string
	Pool   string
	Data   map[string]string
}

type addrAnswer struct {
	Address string
	Data    map[string]string
}

func (p *plugin) pool(overlay string, v6 bool) poolAnswer {
	p.t.Helper()
	var out poolAnswer
	p.ok("/IpamDriver.RequestPool", map[string]any{"AddressSpace": "CarveLocal", "Options": map[string]string{"network": overlay}, "V6": v6}, &out)
	return out
}

// networkPool asks for the pool of a Docker network of the given range, as
// Docker does for the network carve made (it names its subnet).
func (p *plugin) networkPool(overlay, cidr string) poolAnswer {
	p.t.Helper()
	var out poolAnswer
	p.ok("/IpamDriver.RequestPool", map[string]any{"AddressSpace": "CarveLocal", "Pool": cidr, "Options": map[string]string{"network": overlay}}, &out)
	return out
}

func (p *plugin) address(poolID, addr string, opts map[string]string) string {
	p.t.Helper()
	var out addrAnswer
	p.ok("/IpamDriver.RequestAddress", map[string]any{"PoolID": poolID, "Address": addr, "Options": opts}, &out)
	return out.Address
}

func wantContains(t *testing.T, what, got string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(got, p) {
			t.Errorf("%s: %q does not mention %q", what, got, p)
		}
	}
}

// dockerAllocs lists the docker-bridge allocations of an overlay as
// "container/ifname=addr,addr".
func dockerAllocs(svc dockeripam.AddressService, overlay string) map[string]string {
	out := map[string]string{}
	for _, a := range svc.List(overlay).Allocations {
		if a.Bridge != api.BridgeDocker {
			continue
		}
		var ips []string
		for _, ip := range a.IPs {
			ips = append(ips, ip.Address)
		}
		out[a.ContainerID+"/"+a.IfName] = strings.Join(ips, ",")
	}
	return out
}

func TestPluginProtocol(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) { testProtocol(t, b.svc) })
	}
}

func testProtocol(t *testing.T, svc dockeripam.AddressService) {
	p := newPlugin(t, svc)
	v4, v6, ok := svc.BridgeSubnets("carve", api.BridgeDocker)
	if !ok || !v4.IsValid() || !v6.IsValid() {
		t.Fatalf("carve's docker ranges: %v %v %v", v4, v6, ok)
	}
	gw4, gw6 := v4.Masked().Addr().Next(), v6.Masked().Addr().Next()
	with := func(a netip.Addr, bits int) string { return netip.PrefixFrom(a, bits).String() }

	t.Run("handshake", func(t *testing.T) {
		for path, want := range map[string]string{
			"/Plugin.Activate":                    `{"Implements":["IpamDriver"]}`,
			"/IpamDriver.GetCapabilities":         `{"RequiresMACAddress":false,"RequiresRequestReplay":false}`,
			"/IpamDriver.GetDefaultAddressSpaces": `{"LocalDefaultAddressSpace":"CarveLocal","GlobalDefaultAddressSpace":"CarveGlobal"}`,
		} {
			if got := p.ok(path, "null", nil); got != want {
				t.Errorf("%s = %s, want %s", path, got, want)
			}
		}
		if got := p.ok("/IpamDriver.ReleasePool", map[string]string{"PoolID": "carve/carve/4/" + v4.String()}, nil); got != "{}" {
			t.Errorf("ReleasePool = %s", got)
		}
	})

	pool4, pool6 := p.networkPool("carve", v4.String()), p.pool("carve", true)
	t.Run("pools are the overlay's docker ranges", func(t *testing.T) {
		if pool4.Pool != v4.String() || pool4.Data[gatewayType] != with(gw4, v4.Bits()) {
			t.Errorf("v4 pool %+v, want %s with gateway %s", pool4, v4, gw4)
		}
		if pool6.Pool != v6.String() || pool6.Data[gatewayType] != with(gw6, v6.Bits()) {
			t.Errorf("v6 pool %+v, want %s with gateway %s", pool6, v6, gw6)
		}
		if pool4.PoolID == pool6.PoolID {
			t.Errorf("one pool id for both families: %s", pool4.PoolID)
		}
		var same poolAnswer
		p.ok("/IpamDriver.RequestPool", map[string]any{"Pool": v4.String(), "Options": map[string]string{"network": "carve"}}, &same)
		if same.PoolID != pool4.PoolID {
			t.Errorf("explicit pool: id %s, want %s", same.PoolID, pool4.PoolID)
		}
	})

	t.Run("pool refusals", func(t *testing.T) {
		wantContains(t, "no overlay named among two", p.fail("/IpamDriver.RequestPool", map[string]any{}), "--ipam-opt network=", "carve", "blue")
		wantContains(t, "foreign pool", p.fail("/IpamDriver.RequestPool", map[string]any{"Pool": "172.18.0.0/16", "Options": map[string]string{"network": "carve"}}),
			"172.18.0.0/16", v4.String(), "carve")
		wantContains(t, "part of the range", p.fail("/IpamDriver.RequestPool", map[string]any{"Pool": netip.PrefixFrom(v4.Addr(), v4.Bits()+1).String(), "Options": map[string]string{"network": "carve"}}),
			v4.String())
		wantContains(t, "unknown overlay", p.fail("/IpamDriver.RequestPool", map[string]any{"Options": map[string]string{"network": "red"}}), `"red"`, "not configured")
		wantContains(t, "no IPv6", p.fail("/IpamDriver.RequestPool", map[string]any{"V6": true, "Options": map[string]string{"network": "blue"}}), "IPv6", "blue")
		wantContains(t, "ip range", p.fail("/IpamDriver.RequestPool", map[string]any{"Pool": v4.String(), "SubPool": v4.String(), "Options": map[string]string{"network": "carve"}}), "--ip-range")
		wantContains(t, "no subnet: dockerd would ask forever", p.fail("/IpamDriver.RequestPool", map[string]any{"Options": map[string]string{"network": "carve"}}),
			"docker run --net carve", v4.String())
		wantContains(t, "bad pool", p.fail("/IpamDriver.RequestPool", map[string]any{"Pool": "nonsense", "Options": map[string]string{"network": "carve"}}), "nonsense")
	})

	t.Run("gateway is the bridge's and allocates nothing", func(t *testing.T) {
		gwOpt := map[string]string{"RequestAddressType": gatewayType}
		if got := p.address(pool4.PoolID, gw4.String(), gwOpt); got != with(gw4, v4.Bits()) {
			t.Errorf("gateway %s, want %s", got, with(gw4, v4.Bits()))
		}
		if got := p.address(pool4.PoolID, "", gwOpt); got != with(gw4, v4.Bits()) {
			t.Errorf("gateway without preference %s", got)
		}
		if got := p.address(pool6.PoolID, gw6.String(), gwOpt); got != with(gw6, v6.Bits()) {
			t.Errorf("v6 gateway %s, want %s", got, with(gw6, v6.Bits()))
		}
		wantContains(t, "other gateway", p.fail("/IpamDriver.RequestAddress", map[string]any{"PoolID": pool4.PoolID, "Address": gw4.Next().String(), "Options": gwOpt}),
			gw4.String(), gw4.Next().String())
		if got := dockerAllocs(svc, "carve"); len(got) != 0 {
			t.Errorf("gateway requests allocated %v", got)
		}
	})

	var first string
	t.Run("addresses come from the docker range, one family per attachment", func(t *testing.T) {
		first = p.address(pool4.PoolID, "", nil)
		if want := with(gw4.Next(), v4.Bits()); first != want {
			t.Errorf("first address %s, want %s", first, want)
		}
		if second := p.address(pool4.PoolID, "", nil); second != with(gw4.Next().Next(), v4.Bits()) {
			t.Errorf("second address %s", second)
		}
		if a6 := p.address(pool6.PoolID, "", nil); a6 != with(gw6.Next(), v6.Bits()) {
			t.Errorf("first v6 address %s, want %s", a6, with(gw6.Next(), v6.Bits()))
		}
		allocs := dockerAllocs(svc, "carve")
		if len(allocs) != 3 {
			t.Fatalf("allocations %v, want 3", allocs)
		}
		for at, ips := range allocs {
			if !strings.HasPrefix(at, "docker-") || strings.Contains(ips, ",") {
				t.Errorf("allocation %s=%s: want a docker- attachment with one address", at, ips)
			}
		}
	})

	t.Run("preferred addresses are claimed", func(t *testing.T) {
		want := gw4
		for range 10 {
			want = want.Next()
		}
		if got := p.address(pool4.PoolID, want.String(), nil); got != with(want, v4.Bits()) {
			t.Errorf("preferred %s, got %s", want, got)
		}
		wantContains(t, "taken", p.fail("/IpamDriver.RequestAddress", map[string]any{"PoolID": pool4.PoolID, "Address": want.String()}), want.String())
		wantContains(t, "outside", p.fail("/IpamDriver.RequestAddress", map[string]any{"PoolID": pool4.PoolID, "Address": "172.18.0.5"}), "172.18.0.5", v4.String())
		wantContains(t, "wrong family", p.fail("/IpamDriver.RequestAddress", map[string]any{"PoolID": pool4.PoolID, "Address": gw6.Next().String()}), "family")
	})

	t.Run("a MAC makes a replayed request idempotent", func(t *testing.T) {
		opts := map[string]string{"com.docker.network.endpoint.macaddress": "02:42:0a:80:00:99"}
		a, b := p.address(pool4.PoolID, "", opts), p.address(pool4.PoolID, "", opts)
		if a != b {
			t.Errorf("replay got %s then %s", a, b)
		}
		if _, ok := dockerAllocs(svc, "carve")["docker-02420a800099/eth0"]; !ok {
			t.Errorf("no attachment docker-02420a800099/eth0 in %v", dockerAllocs(svc, "carve"))
		}
	})

	t.Run("release", func(t *testing.T) {
		before := len(dockerAllocs(svc, "carve"))
		addr := strings.Split(first, "/")[0]
		if got := p.ok("/IpamDriver.ReleaseAddress", map[string]string{"PoolID": pool4.PoolID, "Address": addr}, nil); got != "{}" {
			t.Errorf("ReleaseAddress = %s", got)
		}
		after := dockerAllocs(svc, "carve")
		if len(after) != before-1 {
			t.Errorf("after releasing %s: %v", addr, after)
		}
		for _, ips := range after {
			if ips == first {
				t.Errorf("%s still allocated", first)
			}
		}
		// Never given, the gateway, twice the same: all fine, nothing freed.
		for _, a := range []string{addr, gw4.String(), with(gw4, v4.Bits())} {
			p.ok("/IpamDriver.ReleaseAddress", map[string]string{"PoolID": pool4.PoolID, "Address": a}, nil)
		}
		if got := dockerAllocs(svc, "carve"); len(got) != len(after) {
			t.Errorf("tolerated releases freed something: %v", got)
		}
		// The next request does not reuse the freed address at once
		// (allocation is round-robin, see ring.Allocator.Allocate).
		if again := p.address(pool4.PoolID, "", nil); again == first {
			t.Errorf("after release got the freed %s again at once", again)
		}
	})

	t.Run("release never frees another bridge's attachment", func(t *testing.T) {
		m, err := svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "cni-1", IfName: "eth0", Bridge: api.BridgeMesos, Family: "4"})
		if err != nil {
			t.Fatal(err)
		}
		addr := strings.Split(m.IPs[0].Address, "/")[0]
		p.ok("/IpamDriver.ReleaseAddress", map[string]string{"PoolID": pool4.PoolID, "Address": addr}, nil)
		found := false
		for _, a := range svc.List("carve").Allocations {
			found = found || a.ContainerID == "cni-1"
		}
		if !found {
			t.Errorf("releasing the mesos address %s through a docker pool freed it", addr)
		}
	})

	t.Run("malformed and stale requests", func(t *testing.T) {
		wantContains(t, "bad json", p.fail("/IpamDriver.RequestPool", "{"), "bad request body")
		wantContains(t, "bad pool id", p.fail("/IpamDriver.RequestAddress", map[string]string{"PoolID": "default/10.0.0.0/8"}), "not carve's")
		stale := "carve/carve/4/10.99.0.0/25"
		wantContains(t, "stale pool", p.fail("/IpamDriver.RequestAddress", map[string]string{"PoolID": stale}), "stale", "10.99.0.0/25", v4.String())
		wantContains(t, "bad address", p.fail("/IpamDriver.ReleaseAddress", map[string]string{"PoolID": pool4.PoolID, "Address": "x"}), `"x"`)
		code, _, body := pluginCall(t, p.h, "/IpamDriver.Nope", nil)
		if code != http.StatusNotFound || !strings.Contains(body, `"Err"`) {
			t.Errorf("unknown endpoint: %d %s", code, body)
		}
		rec := httptest.NewRecorder()
		p.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/Plugin.Activate", nil))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET: %d", rec.Code)
		}
	})

	t.Run("the only overlay needs no option", func(t *testing.T) {
		single := emptyService(t)
		single.addOverlay("solo", [2]string{"10.1.0.0/16"}, [2]string{}, [2]string{"10.1.0.128/25"})
		sp := newPlugin(t, single)
		var out poolAnswer
		sp.ok("/IpamDriver.RequestPool", map[string]any{"Pool": "10.1.0.128/25"}, &out)
		if out.Pool != "10.1.0.128/25" {
			t.Errorf("pool %+v", out)
		}
	})
}
