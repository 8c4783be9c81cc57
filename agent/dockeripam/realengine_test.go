package dockeripam_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/dockerlab"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestRealDockerEngine runs a real dockerd (and its containerd) inside a
// network namespace with a real carve agent, lets the engine loop create the
// Docker networks on carve's bridges (named after the overlays, as DC/OS
// names them, on the bridges d-<overlay>), runs a container on carve and checks
// that its address comes from, and goes back to, the agent's IPAM.
//
// Containment is dockerlab's (the engine in the lab's host namespace and a
// private mount namespace, its own directories and cgroups, stopped by
// PID); the root namespace's links, routes and firewall are compared
// before and after.
func TestRealDockerEngine(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root: network namespaces and a Docker engine")
	bins, err := dockerlab.Binaries()
	testutil.Require(t, err == nil, "%v", err)
	busybox, err := enginelab.StaticBusybox()
	testutil.Require(t, err == nil, "%v", err)

	rootBefore := rootState(t)
	t.Cleanup(func() {
		if after := rootState(t); after != rootBefore {
			t.Errorf("the root namespace changed:\n--- before\n%s\n--- after\n%s", rootBefore, after)
		}
	})
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	host := lab.Hosts()[0]
	a := realAgent(t, host)
	ipam := a.IPAM()
	v4, v6, _ := ipam.BridgeSubnets("carve", api.BridgeDocker)
	gw4, gw6 := v4.Masked().Addr().Next(), v6.Masked().Addr().Next()
	testutil.Eventually(t, waitLimit, "the agent's d-carve bridge with its gateways", testutil.True(func() bool {
		return bridgeHas(t, host, "d-carve", netip.PrefixFrom(gw4, v4.Bits()), netip.PrefixFrom(gw6, v6.Bits()))
	}))
	// The overlay MTU the agent chose (it follows the lab's underlay), which
	// the agent hands its Docker plugin as the networks' MTU.
	carveMTU := linkMTU(t, host, "d-carve")

	// The plugin, on a socket in the directory the engine sees as
	// /run/docker/plugins, under a name unique to this run.
	driverName := fmt.Sprintf("carve-test-%d", os.Getpid())
	clk := &clock{now: time.Now()}
	dir := shortTempDir(t)
	pluginDir := filepath.Join(shortTempDir(t), "plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	engineDir := filepath.Join(dir, "engine")
	s := runService(t, ipam, dockeripam.Options{
		PluginSocket: filepath.Join(pluginDir, driverName+".sock"),
		DockerHost:   "unix://" + filepath.Join(engineDir, "docker.sock"),
		MTU:          func(string) int { return carveMTU },
		EngineRetry:  200 * time.Millisecond, GCInterval: time.Hour, GCGrace: time.Minute, Now: clk.Now,
	})

	d := startEngine(t, host, engineDir, pluginDir, bins)
	testutil.Eventually(t, waitLimit, "the engine loop connects and creates both networks", testutil.True(func() bool {
		st := s.Status()
		for _, n := range st.Networks {
			if n.State == dockeripam.NetworkMismatch || n.State == dockeripam.NetworkError {
				t.Fatalf("network %s: %s: %s", n.Name, n.State, n.Error)
			}
		}
		return st.Engine.Connected && networkState(s, "carve").State == dockeripam.NetworkOK && networkState(s, "blue").State == dockeripam.NetworkOK
	}))
	t.Logf("engine: %+v", s.Status().Engine)

	var net1 struct {
		Name, Driver string
		EnableIPv6   bool
		IPAM         struct {
			Driver  string
			Config  []map[string]string
			Options map[string]string
		}
		Options map[string]string
	}
	d.call(t, http.MethodGet, "/networks/carve", nil, &net1)
	t.Logf("docker network carve: %+v", net1)
	if net1.Name != "carve" || net1.IPAM.Driver != driverName || !net1.EnableIPv6 || net1.Options["com.docker.network.bridge.name"] != "d-carve" {
		t.Errorf("network carve (on bridge d-carve) as Docker sees it: %+v", net1)
	}
	// Docker adopted carve's bridge as it was: same gateways, same MTU.
	if !bridgeHas(t, host, "d-carve", netip.PrefixFrom(gw4, v4.Bits()), netip.PrefixFrom(gw6, v6.Bits())) {
		t.Error("d-carve lost its gateway addresses to Docker")
	}
	if mtu := linkMTU(t, host, "d-carve"); mtu != carveMTU || net1.Options["com.docker.network.driver.mtu"] != strconv.Itoa(carveMTU) {
		t.Errorf("d-carve MTU %d, Docker's network MTU %s; want both the agent's %d", mtu, net1.Options["com.docker.network.driver.mtu"], carveMTU)
	}

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := d.ImportBusybox(ctx, busybox); err != nil {
		t.Fatal(err)
	}
	// A container without a network first: if the runtime cannot run
	// containers in this sandbox, that is the sandbox's limit, not carve's.
	probe, err := d.run(t, "none")
	testutil.Require(t, err == nil, "dockerd cannot run containers here: %v", err)
	d.remove(t, probe)

	id, err := d.run(t, "carve")
	if err != nil {
		t.Fatalf("container on network carve: %v", err)
	}
	var inspect struct {
		NetworkSettings struct {
			Networks map[string]struct {
				IPAddress, Gateway, GlobalIPv6Address, IPv6Gateway, MacAddress string
				IPPrefixLen, GlobalIPv6PrefixLen                               int
			}
		}
	}
	d.call(t, http.MethodGet, "/containers/"+id+"/json", nil, &inspect)
	ep := inspect.NetworkSettings.Networks["carve"]
	t.Logf("container %.12s on network carve: %+v", id, ep)
	addr4, err4 := netip.ParseAddr(ep.IPAddress)
	addr6, err6 := netip.ParseAddr(ep.GlobalIPv6Address)
	if err4 != nil || err6 != nil || !v4.Contains(addr4) || !v6.Contains(addr6) || ep.IPPrefixLen != v4.Bits() || ep.GlobalIPv6PrefixLen != v6.Bits() {
		t.Fatalf("container addresses %s/%d, %s/%d: want them in the docker ranges %s, %s", ep.IPAddress, ep.IPPrefixLen, ep.GlobalIPv6Address, ep.GlobalIPv6PrefixLen, v4, v6)
	}
	if ep.Gateway != gw4.String() || ep.IPv6Gateway != gw6.String() {
		t.Errorf("container gateways %s, %s: want carve's %s, %s", ep.Gateway, ep.IPv6Gateway, gw4, gw6)
	}
	if addr4 != gw4.Next() {
		t.Errorf("container got %s, want the lowest free %s", addr4, gw4.Next())
	}
	held := dockerAllocs(ipam, "carve")
	if !slices.Contains(mapValues(held), netip.PrefixFrom(addr4, v4.Bits()).String()) || !slices.Contains(mapValues(held), netip.PrefixFrom(addr6, v6.Bits()).String()) {
		t.Fatalf("the agent's allocations %v lack the container's %s and %s", held, addr4, addr6)
	}
	if ports := bridgePorts(t, host, "d-carve"); len(ports) != 1 {
		t.Errorf("ports of d-carve: %v, want the container's veth", ports)
	}

	// The leak collector, against the real engine: an allocation no
	// container uses goes after the grace period; the container's stays.
	leak, err := ipam.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "docker-leaked", IfName: "eth0", Bridge: api.BridgeDocker, Family: "4"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.advance(2 * time.Minute)
	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := dockerAllocs(ipam, "carve")
	if _, ok := after["docker-leaked/eth0"]; ok {
		t.Errorf("the leak %s outlived its grace period: %v", leak.IPs[0].Address, after)
	}
	if len(after) != len(held) {
		t.Errorf("the collector released a live container's address: before %v, after %v", held, after)
	}

	d.remove(t, id)
	testutil.Eventually(t, waitLimit, "the container's addresses released", testutil.True(func() bool { return len(dockerAllocs(ipam, "carve")) == 0 }))
	if ports := bridgePorts(t, host, "d-carve"); len(ports) != 0 {
		t.Errorf("ports of d-carve after removal: %v", ports)
	}

	// docker run --ip: the address is given exactly when free; taken, it
	// is refused naming the holder; a bridge address is refused.
	want := v4.Masked().Addr()
	for range 10 {
		want = want.Next()
	}
	fixed, err := d.runWithIP(t, "carve", want)
	if err != nil {
		t.Fatalf("docker run --ip %s: %v", want, err)
	}
	d.call(t, http.MethodGet, "/containers/"+fixed+"/json", nil, &inspect)
	if got := inspect.NetworkSettings.Networks["carve"].IPAddress; got != want.String() {
		t.Errorf("docker run --ip %s: the container has %s", want, got)
	}
	for _, tt := range []struct {
		name string
		ip   netip.Addr
		msg  string
	}{
		{"taken", want, "is taken by docker container"},
		{"gateway", gw4, "gateway"},
	} {
		if id, err := d.runWithIP(t, "carve", tt.ip); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("docker run --ip %s (%s): %v, want an error saying %q", tt.ip, tt.name, err, tt.msg)
			if err == nil {
				d.remove(t, id)
			}
		}
	}
	d.remove(t, fixed)
	testutil.Eventually(t, waitLimit, "the --ip container's addresses released", testutil.True(func() bool { return len(dockerAllocs(ipam, "carve")) == 0 }))

	// A Docker network removed by hand comes back, on carve's bridge.
	d.call(t, http.MethodDelete, "/networks/blue", nil, nil)
	b4, _, _ := ipam.BridgeSubnets("blue", api.BridgeDocker)
	blueGW := netip.PrefixFrom(b4.Masked().Addr().Next(), b4.Bits())
	t.Logf("after docker network rm blue, carve's bridge d-blue is still there: %v", bridgeHas(t, host, "d-blue"))
	s.Sync()
	testutil.Eventually(t, waitLimit, "network blue recreated", testutil.True(func() bool {
		var n struct{ IPAM struct{ Driver string } }
		return d.try(http.MethodGet, "/networks/blue", nil, &n) == nil && n.IPAM.Driver == driverName
	}))
	testutil.Eventually(t, waitLimit, "d-blue with its gateway", testutil.True(func() bool { return bridgeHas(t, host, "d-blue", blueGW) }))
	// The same pass inspected d-carve as Docker reports it: no difference.
	testutil.Eventually(t, waitLimit, "d-blue ok", testutil.True(func() bool { return networkState(s, "blue").State == dockeripam.NetworkOK }))
	if st := networkState(s, "carve"); st.State != dockeripam.NetworkOK {
		t.Errorf("d-carve, inspected: %+v", st)
	}

	// The network an older carve created as d-carve (same bridge, same
	// IPAM): kept while a container uses it, replaced by carve once not.
	// The running service recreates a network removed by hand (above):
	// removed again until the legacy one takes the bridge first.
	legacy := map[string]any{
		"Name": "d-carve", "Driver": "bridge", "EnableIPv6": true, "CheckDuplicate": true,
		"IPAM":    map[string]any{"Driver": driverName, "Options": map[string]string{"network": "carve"}, "Config": net1.IPAM.Config},
		"Options": net1.Options, "Labels": map[string]string{dockeripam.LabelOverlay: "carve"},
	}
	testutil.Eventually(t, waitLimit, "the legacy network d-carve in place of carve", func() error {
		_ = d.try(http.MethodDelete, "/networks/carve", nil, nil)
		return d.try(http.MethodPost, "/networks/create", legacy, nil)
	})
	old, err := d.run(t, "d-carve")
	if err != nil {
		t.Fatalf("container on the legacy network d-carve: %v", err)
	}
	s.Sync()
	testutil.Eventually(t, waitLimit, "carve reported legacy", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkLegacy }))
	t.Logf("legacy: %+v", networkState(s, "carve"))
	if err := d.try(http.MethodGet, "/networks/d-carve", nil, nil); err != nil {
		t.Fatalf("the legacy network in use was removed: %v", err)
	}
	d.remove(t, old)
	s.Sync()
	testutil.Eventually(t, waitLimit, "carve migrated", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))
	if err := d.try(http.MethodGet, "/networks/d-carve", nil, nil); err == nil {
		t.Error("the unused legacy network d-carve is still there")
	}
	if err := d.try(http.MethodGet, "/networks/carve", nil, &net1); err != nil || net1.Options["com.docker.network.bridge.name"] != "d-carve" {
		t.Errorf("network carve after the migration: %+v, %v", net1, err)
	}
	if !bridgeHas(t, host, "d-carve", netip.PrefixFrom(gw4, v4.Bits())) {
		t.Error("d-carve lost its gateway in the migration")
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, strings.Split(v, ",")...)
	}
	return out
}

// rootState is what the test must not change in the root namespace: link
// names, routes and firewall rules (counters aside).
func rootState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	run := func(name string, args ...string) {
		if _, err := exec.LookPath(name); err != nil {
			return
		}
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		fmt.Fprintf(&b, "# %s %s\n", name, strings.Join(args, " "))
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
				continue
			}
			if name == "ip" && args[1] == "link" {
				// "2: eth0@if3: <FLAGS> ...": the name only.
				f := strings.SplitN(l, ": ", 3)
				if len(f) < 2 {
					continue
				}
				l = f[1]
			}
			if strings.HasSuffix(name, "tables-save") {
				l = counters.ReplaceAllString(l, "")
			}
			b.WriteString(l + "\n")
		}
	}
	run("ip", "-o", "link", "show")
	run("ip", "-4", "route", "show", "table", "all")
	run("ip", "-6", "route", "show", "table", "all")
	run("iptables-save")
	run("ip6tables-save")
	return b.String()
}

// counters matches iptables-save's packet counters, which traffic changes.
var counters = regexp.MustCompile(`\[\d+:\d+\]`)

func bridgeHas(t *testing.T, host *netnslab.Host, name string, addrs ...netip.Prefix) bool {
	t.Helper()
	h, err := host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return false
	}
	have, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range addrs {
		found := false
		for _, a := range have {
			ones, _ := a.Mask.Size()
			if ip, ok := netip.AddrFromSlice(a.IP); ok && netip.PrefixFrom(ip.Unmap(), ones) == want {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func linkMTU(t *testing.T, host *netnslab.Host, name string) int {
	t.Helper()
	h, err := host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return link.Attrs().MTU
}

// bridgePorts names the links enslaved to a bridge in host.
func bridgePorts(t *testing.T, host *netnslab.Host, name string) []string {
	t.Helper()
	h, err := host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// startEngine starts a Docker engine (dockerlab) in host's namespace with
// the plugin directory pluginDir; it skips the test, with dockerd's own
// words, when the daemon cannot run in this sandbox.
func startEngine(t *testing.T, host *netnslab.Host, dir, pluginDir string, bins map[string]string) *engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := dockerlab.Start(ctx, host, dockerlab.Options{Dir: dir, PluginDir: pluginDir, Bins: bins,
		CgroupParent: fmt.Sprintf("carve-test-%d", os.Getpid())})
	testutil.Require(t, !errors.Is(err, dockerlab.ErrCannotRun), "%v", err)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(e.LogTail(8000))
		}
		if err := e.Stop(); err != nil {
			t.Errorf("stop the Docker engine: %v", err)
		}
	})
	return &engine{e}
}

// engine adds the test's failure handling to a dockerlab engine.
type engine struct{ *dockerlab.Engine }

// callTimeout bounds one engine call of the test.
const callTimeout = 2 * time.Minute

// try makes an engine call and reports failure as an error.
func (d *engine) try(method, path string, in any, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return d.CallJSON(ctx, method, path, in, out)
}

func (d *engine) call(t *testing.T, method, path string, in any, out any) {
	t.Helper()
	if err := d.try(method, path, in, out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
}

func (d *engine) run(t *testing.T, network string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return d.Run(ctx, network)
}

// runWithIP runs a container on a network with a fixed IPv4 address, as
// docker run --net NETWORK --ip IP does; a failed start is removed.
func (d *engine) runWithIP(t *testing.T, network string, ip netip.Addr) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var created struct {
		ID string `json:"Id"`
	}
	body := map[string]any{
		"Image": dockerlab.Image, "Cmd": []string{"/bin/sleep", "3600"},
		"HostConfig":       map[string]any{"NetworkMode": network},
		"NetworkingConfig": map[string]any{"EndpointsConfig": map[string]any{network: map[string]any{"IPAMConfig": map[string]any{"IPv4Address": ip.String()}}}},
	}
	if err := d.CallJSON(ctx, http.MethodPost, "/containers/create", body, &created); err != nil {
		return "", err
	}
	if err := d.Call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		_ = d.Call(ctx, http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, nil)
		return "", err
	}
	return created.ID, nil
}

func (d *engine) remove(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := d.Remove(ctx, id); err != nil {
		t.Fatalf("remove container %.12s: %v", id, err)
	}
}
