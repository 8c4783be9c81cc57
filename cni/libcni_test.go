package cni

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// These tests drive carve-ipam the way a runtime does: libcni loads the
// conflist the agent wrote and runs the reference bridge and portmap
// plugins, which run carve-ipam, which asks the real agent. libcni is called
// from inside the agent's host namespace (the plugins it forks inherit it,
// so the veths land there), and each container is another namespace of the
// lab. Nothing touches the namespace the tests run in.

// cniHost is the host of a test agent with a libcni runtime of its own.
type cniHost struct {
	lab     *netnslab.Lab
	host    *netnslab.Namespace
	agent   *testAgent
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
	overlay string
	mesos   netip.Prefix
	mtu     int
}

// newCNIHost starts an agent (see startAgent) and loads the conflist it
// wrote for ov; a host whose agent is not ready gets the conflist the agent
// would write (it writes none before its lease).
func newCNIHost(t *testing.T, ready bool) *cniHost {
	t.Helper()
	a := startAgent(t, ready)
	h := &cniHost{lab: a.c.Lab, host: a.h.NS.Namespace, agent: a, overlay: "ov", mesos: ovMesos, mtu: a.c.OverlayMTU()}
	confDir := a.h.CNIConfDir()
	if !ready {
		confDir = t.TempDir()
		if _, err := netconf.WriteConflist(confDir, netconf.Conflist{Overlay: h.overlay, MTU: h.mtu, Socket: a.Sock, CNIVersion: netconf.LatestCNIVersion}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "the agent's conflist for "+h.overlay, func() error {
		var err error
		h.list, err = libcni.LoadNetworkConf(confDir, h.overlay)
		return err
	})
	// An explicit exec: with nil, libcni sets its default lazily on every
	// call, a data race when one CNIConfig runs calls concurrently.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	h.cni = libcni.NewCNIConfigWithCacheDir(pluginPath(t), t.TempDir(), exec)
	return h
}

// gateway is the bridge's address, the containers' gateway.
func (h *cniHost) gateway() netip.Addr { return h.mesos.Addr().Next() }

// container creates an empty container namespace.
func (h *cniHost) container(t *testing.T, suffix string) *netnslab.Namespace {
	t.Helper()
	c, err := h.lab.AddNamespace(suffix)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func runtimeConf(cid string, c *netnslab.Namespace) *libcni.RuntimeConf {
	rc := &libcni.RuntimeConf{ContainerID: cid, IfName: "eth0"}
	if c != nil {
		rc.NetNS = c.Path
	}
	return rc
}

// The libcni calls, made from inside the host namespace.

func (h *cniHost) add(rt *libcni.RuntimeConf) (*types100.Result, error) {
	var res types.Result
	err := h.host.Do(func() error {
		var err error
		res, err = h.cni.AddNetworkList(context.Background(), h.list, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return types100.NewResultFromResult(res)
}

func (h *cniHost) check(rt *libcni.RuntimeConf) error {
	return h.host.Do(func() error { return h.cni.CheckNetworkList(context.Background(), h.list, rt) })
}

func (h *cniHost) del(rt *libcni.RuntimeConf) error {
	return h.host.Do(func() error { return h.cni.DelNetworkList(context.Background(), h.list, rt) })
}

func (h *cniHost) gc(list *libcni.NetworkConfigList, valid ...string) error {
	args := &libcni.GCArgs{}
	for _, v := range valid {
		cid, ifn, _ := strings.Cut(v, "/")
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: cid, IfName: ifn})
	}
	return h.host.Do(func() error { return h.cni.GCNetworkList(context.Background(), list, args) })
}

func (h *cniHost) status() error {
	return h.host.Do(func() error { return h.cni.GetStatusNetworkList(context.Background(), h.list) })
}

// containerAddr reads eth0's IPv4 address, MTU and default gateway inside
// the container.
func containerAddr(t *testing.T, c *netnslab.Namespace) (netip.Prefix, int, netip.Addr) {
	t.Helper()
	nh, err := c.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	link, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in %s: %v", c.Name, err)
	}
	addrs, err := nh.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		t.Fatalf("addresses of eth0 in %s: %v, %v", c.Name, addrs, err)
	}
	ip, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	ones, _ := addrs[0].Mask.Size()
	routes, err := nh.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var gw netip.Addr
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw != nil {
			gw, _ = netip.AddrFromSlice(r.Gw.To4())
		}
	}
	return netip.PrefixFrom(ip, ones), link.Attrs().MTU, gw
}

// hostVeths lists the ports of the overlay's bridge in the host namespace:
// the host ends of the containers' veths.
func (h *cniHost) hostVeths(t *testing.T) []string {
	t.Helper()
	nh, err := h.host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	br, err := nh.LinkByName(netconf.MesosBridge(h.overlay))
	if err != nil {
		t.Fatal(err)
	}
	links, err := netlinksafe.Handle{Handle: nh}.LinkList()
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

func TestLibcniAddCheckDel(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	c := h.container(t, "c1")
	rt := runtimeConf("cid-1", c)

	res, err := h.add(rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.0.2/25" || res.IPs[0].Gateway.String() != "10.1.0.1" {
		t.Fatalf("ADD result IPs = %v", res.IPs)
	}
	// The bridge plugin filled in the interfaces: the bridge, the host veth
	// and eth0 in the container, which the address belongs to.
	if i := res.IPs[0].Interface; i == nil || *i >= len(res.Interfaces) || res.Interfaces[*i].Name != "eth0" || res.Interfaces[*i].Sandbox != c.Path {
		t.Errorf("ADD result interfaces = %v, IP on %v", res.Interfaces, res.IPs[0].Interface)
	}

	// The kernel agrees: inside the container, eth0 has the address, the
	// overlay MTU and the default route via the bridge.
	addr, mtu, gw := containerAddr(t, c)
	if addr.String() != "10.1.0.2/25" || mtu != h.mtu || gw != h.gateway() {
		t.Errorf("container eth0: %s mtu %d gateway %s; want 10.1.0.2/25 mtu %d via %s", addr, mtu, gw, h.mtu, h.gateway())
	}
	// In the host, the veth is a hairpin port of m-ov.
	veths := h.hostVeths(t)
	if len(veths) != 1 {
		t.Fatalf("ports of m-ov: %v; want the container's veth", veths)
	}
	nh, err := h.host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	veth, err := nh.LinkByName(veths[0])
	if err != nil {
		t.Fatal(err)
	}
	br, err := nh.LinkByName("m-ov")
	if err != nil {
		t.Fatal(err)
	}
	if veth.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("veth %s is not on m-ov", veths[0])
	}
	if pi, err := nh.LinkGetProtinfo(veth); err != nil || !pi.Hairpin {
		t.Errorf("hairpin on %s = %v, %v", veths[0], pi.Hairpin, err)
	}
	// The plugins ran in the host namespace: the veth is not in the
	// namespace the tests run in.
	if _, err := netlink.LinkByName(veths[0]); err == nil {
		t.Errorf("the host veth %s is in the tests' own namespace", veths[0])
	}
	// The container reaches its gateway (traffic inside the lab only).
	if err := c.PingRetry(context.Background(), h.gateway(), 5); err != nil {
		t.Errorf("container cannot ping its gateway: %v", err)
	}

	if err := h.check(rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// The agent lost the allocation: CHECK says so; the address comes back
	// (asked for by name: allocation is round-robin, a freed address is not
	// handed out again at once) and CHECK passes again.
	cl := h.agent.ipam
	req := api.IPAMRequest{Network: "ov", ContainerID: "cid-1", IfName: "eth0"}
	if _, err := cl.Release(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := h.check(rt); err == nil || !strings.Contains(err.Error(), "holds no address") {
		t.Errorf("CHECK without the allocation = %v", err)
	}
	req.Address = "10.1.0.2"
	if _, err := cl.Allocate(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := h.check(rt); err != nil {
		t.Errorf("CHECK after re-allocation: %v", err)
	}

	if err := h.del(rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if keys := h.agent.Keys(t, "ov"); len(keys) != 0 {
		t.Errorf("after DEL the agent holds %v", keys)
	}
	if v := h.hostVeths(t); len(v) != 0 {
		t.Errorf("after DEL the host still has %v", v)
	}
	if err := h.del(rt); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// TestLibcniDelUnknownContainer: a runtime may DEL what it never added, with
// or without the namespace; it must succeed and free nothing else.
func TestLibcniDelUnknownContainer(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	live := runtimeConf("live", h.container(t, "live"))
	if _, err := h.add(live); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		rt   *libcni.RuntimeConf
	}{
		{"empty namespace", runtimeConf("never-added", h.container(t, "empty"))},
		{"no namespace", runtimeConf("never-added-2", nil)},
		{"namespace gone", &libcni.RuntimeConf{ContainerID: "never-added-3", IfName: "eth0", NetNS: "/run/netns/carvecni-does-not-exist"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.del(tc.rt); err != nil {
				t.Fatalf("DEL of an unknown container: %v", err)
			}
			if got := h.agent.Keys(t, "ov"); !slices.Equal(got, []string{"live/eth0"}) {
				t.Errorf("the agent holds %v, want only live/eth0", got)
			}
		})
	}
}

// TestLibcniGC: a runtime's GC frees exactly the attachments it does not list.
func TestLibcniGC(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	containers := map[string]*netnslab.Namespace{}
	for _, cid := range []string{"a", "b", "c", "d"} {
		containers[cid] = h.container(t, cid)
		if _, err := h.add(runtimeConf(cid, containers[cid])); err != nil {
			t.Fatalf("ADD %s: %v", cid, err)
		}
	}
	// An allocation the runtime does not know of (say, its container's
	// ADD result was lost): only carve-ipam's GC can free it.
	if _, err := h.agent.ipam.Allocate(context.Background(), api.IPAMRequest{Network: "ov", ContainerID: "leaked", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}

	// Through the conflist: libcni DELs the attachments it cached and the
	// runtime no longer lists (the bridge plugin then releases them through
	// carve-ipam and removes their veths), then sends GC down the chain.
	if err := h.gc(h.list, "a/eth0", "b/eth0"); err != nil {
		t.Fatalf("GC through the conflist: %v", err)
	}
	keys := h.agent.Keys(t, "ov")
	for _, k := range []string{"c/eth0", "d/eth0"} {
		if slices.Contains(keys, k) {
			t.Errorf("GC kept the unlisted %s: %v", k, keys)
		}
	}
	for _, k := range []string{"a/eth0", "b/eth0"} {
		if !slices.Contains(keys, k) {
			t.Errorf("GC freed the listed %s: %v", k, keys)
		}
	}
	if v := h.hostVeths(t); len(v) != 2 {
		t.Errorf("host links after GC: %v; want the veths of a and b", v)
	}

	// The bridge plugin (v1.9.1) does not pass GC on to its IPAM plugin, so
	// carve-ipam's own GC is driven here by a list that names it directly:
	// the leaked allocation goes, a and b stay.
	direct, err := libcni.ConfListFromBytes(fmt.Appendf(nil,
		`{"cniVersion":"1.1.0","name":"ov","plugins":[{"type":"carve-ipam","ipam":{"type":"carve-ipam","network":"ov","socket":%q}}]}`, h.agent.Sock))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.gc(direct, "a/eth0", "b/eth0"); err != nil {
		t.Fatalf("GC through carve-ipam: %v", err)
	}
	if got, want := h.agent.Keys(t, "ov"), []string{"a/eth0", "b/eth0"}; !slices.Equal(got, want) {
		t.Errorf("after GC the agent holds %v, want exactly %v", got, want)
	}
	// The kernel side follows: a and b keep their eth0, c and d lost theirs.
	for cid, c := range containers {
		nh, err := c.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		_, err = nh.LinkByName("eth0")
		nh.Close()
		if live := cid == "a" || cid == "b"; live != (err == nil) {
			t.Errorf("container %s: eth0 present = %v after GC", cid, err == nil)
		}
	}
}

// TestLibcniAgentDown: with the agent down, ADD answers "try again later",
// DEL fails (the runtime keeps retrying) and STATUS says "not available";
// once the agent is back, the retried DELs go through and nothing leaked.
func TestLibcniAgentDown(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	a := runtimeConf("a", h.container(t, "a"))
	b := runtimeConf("b", h.container(t, "b"))
	if _, err := h.add(a); err != nil {
		t.Fatal(err)
	}
	if err := h.status(); err != nil {
		t.Errorf("STATUS with the agent up: %v", err)
	}

	h.agent.Stop(t)
	if _, err := h.add(b); labcluster.CNICode(err) != types.ErrTryAgainLater || !strings.Contains(err.Error(), h.agent.Sock) {
		t.Errorf("ADD with the agent down = %v (code %d); want code 11 naming the socket", err, labcluster.CNICode(err))
	}
	if err := h.del(a); err == nil {
		t.Error("DEL with the agent down succeeded: the address would leak")
	}
	if err := h.del(b); err == nil {
		t.Error("DEL (after the failed ADD) with the agent down succeeded")
	}
	if err := h.status(); labcluster.CNICode(err) != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with the agent down = %v; want code 50", err)
	}

	h.agent.Start(t)
	for _, rt := range []*libcni.RuntimeConf{a, b} {
		if err := h.del(rt); err != nil {
			t.Errorf("retried DEL %s: %v", rt.ContainerID, err)
		}
	}
	if keys := h.agent.Keys(t, "ov"); len(keys) != 0 {
		t.Errorf("after the retried DELs the agent holds %v", keys)
	}
	if v := h.hostVeths(t); len(v) != 0 {
		t.Errorf("after the retried DELs the host has %v", v)
	}
	if _, err := h.add(b); err != nil {
		t.Errorf("ADD with the agent back: %v", err)
	}
}

// TestLibcniStatusNotReady: STATUS through the bridge plugin reports an
// agent without a lease as plugin-not-available, and recovers once the
// agent registered with a master.
func TestLibcniStatusNotReady(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, false)
	if err := h.status(); labcluster.CNICode(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("STATUS not ready = %v; want code 50 saying so", err)
	}
	h.agent.StartMasters(t)
	if err := h.status(); err != nil {
		t.Errorf("STATUS ready: %v", err)
	}
}

// TestLibcniMesosConf runs the single-plugin <overlay>.conf the agent wrote
// for the Mesos CNI isolator through libcni's single-plugin API (as the
// isolator runs one plugin): the reference bridge plugin with carve-ipam
// attaches a container with an address of the mesos range in a 0.3.1
// result, and DEL gives it back.
func TestLibcniMesosConf(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	dir := h.agent.h.MesosCNIConfDir()
	var conf *libcni.NetworkConfig
	testutil.Eventually(t, 0, "the agent's Mesos CNI conf for "+h.overlay, func() error {
		var err error
		//lint:ignore SA1019 the Mesos CNI isolator reads this single-plugin format: libcni's loader for it stands in for the isolator
		conf, err = libcni.LoadConf(dir, h.overlay)
		return err
	})
	if conf.Network.Type != "bridge" || conf.Network.CNIVersion != netconf.ConfCNIVersion || conf.Network.IPAM.Type != netconf.PluginType {
		t.Fatalf("conf %s: %+v", netconf.ConfPath(dir, h.overlay), conf.Network)
	}
	c := h.container(t, "mesos1")
	rt := runtimeConf("mesos-1", c)
	var raw types.Result
	err := h.host.Do(func() error {
		var err error
		raw, err = h.cni.AddNetwork(context.Background(), conf, rt)
		return err
	})
	if err != nil {
		t.Fatalf("ADD through the single-plugin conf: %v", err)
	}
	if raw.Version() != "0.3.1" {
		t.Errorf("result version %s, want 0.3.1", raw.Version())
	}
	res, err := types100.NewResultFromResult(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.0.2/25" || res.IPs[0].Gateway.String() != "10.1.0.1" {
		t.Fatalf("ADD result IPs = %v", res.IPs)
	}
	addr, mtu, gw := containerAddr(t, c)
	if addr.String() != "10.1.0.2/25" || mtu != h.mtu || gw != h.gateway() {
		t.Errorf("container eth0: %s mtu %d gateway %s; want 10.1.0.2/25 mtu %d via %s", addr, mtu, gw, h.mtu, h.gateway())
	}
	if keys := h.agent.Keys(t, "ov"); !slices.Equal(keys, []string{"mesos-1/eth0"}) {
		t.Errorf("the agent holds %v, want mesos-1/eth0", keys)
	}
	if err := c.PingRetry(context.Background(), h.gateway(), 5); err != nil {
		t.Errorf("container cannot ping its gateway: %v", err)
	}
	if err := h.host.Do(func() error { return h.cni.DelNetwork(context.Background(), conf, rt) }); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if keys := h.agent.Keys(t, "ov"); len(keys) != 0 {
		t.Errorf("after DEL the agent holds %v", keys)
	}
	if v := h.hostVeths(t); len(v) != 0 {
		t.Errorf("after DEL the host still has %v", v)
	}
}

// TestLibcniLegacyConflist runs the 0.4.0 conflist (--cni-version 0.4.0,
// for libcni 0.8: containerd 1.5, Podman 3) through libcni as such a
// runtime does: the reference bridge and portmap plugins and carve-ipam
// take the version, every result is a 0.4.0 result (the only kind libcni
// 0.8 parses), CHECK passes, and STATUS, which 0.4.0 lacks, is not sent.
func TestLibcniLegacyConflist(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	dir := t.TempDir()
	if _, err := netconf.WriteConflist(dir, netconf.Conflist{Overlay: h.overlay, MTU: h.mtu, Socket: h.agent.Sock, CNIVersion: netconf.LegacyCNIVersion}); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.LoadNetworkConf(dir, h.overlay)
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "0.4.0" {
		t.Fatalf("conflist version %s, want 0.4.0", list.CNIVersion)
	}
	h.list = list
	c := h.container(t, "old1")
	rt := runtimeConf("old-1", c)
	var raw types.Result
	err = h.host.Do(func() error {
		var err error
		raw, err = h.cni.AddNetworkList(context.Background(), h.list, rt)
		return err
	})
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if raw.Version() != "0.4.0" {
		t.Fatalf("result version %s, want 0.4.0", raw.Version())
	}
	// What libcni 0.8 does with a plugin's output: parse it in the
	// conflist's version.
	var out strings.Builder
	if err := raw.PrintTo(&out); err != nil {
		t.Fatal(err)
	}
	parsed, err := version.NewResult("0.4.0", []byte(out.String()))
	if err != nil {
		t.Fatalf("the result as libcni 0.8 reads it: %v\n%s", err, out.String())
	}
	res, err := types040.GetResult(parsed)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.0.2/25" || res.IPs[0].Gateway.String() != "10.1.0.1" || res.IPs[0].Version != "4" {
		t.Fatalf("0.4.0 result IPs = %+v", res.IPs)
	}
	addr, mtu, gw := containerAddr(t, c)
	if addr.String() != "10.1.0.2/25" || mtu != h.mtu || gw != h.gateway() {
		t.Errorf("container eth0: %s mtu %d gateway %s; want 10.1.0.2/25 mtu %d via %s", addr, mtu, gw, h.mtu, h.gateway())
	}
	if err := h.check(rt); err != nil {
		t.Errorf("CHECK at 0.4.0: %v", err)
	}
	// No STATUS at 0.4.0: libcni does not send it (a STATUS carve-ipam
	// answered would fail here: the agent is stopped).
	h.agent.Stop(t)
	if err := h.status(); err != nil {
		t.Errorf("STATUS at 0.4.0 reached the plugins: %v", err)
	}
	h.agent.Start(t)
	if err := h.del(rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if keys := h.agent.Keys(t, "ov"); len(keys) != 0 {
		t.Errorf("after DEL the agent holds %v", keys)
	}
	if v := h.hostVeths(t); len(v) != 0 {
		t.Errorf("after DEL the host still has %v", v)
	}
}
