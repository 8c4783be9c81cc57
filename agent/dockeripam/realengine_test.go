package dockeripam_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/netnslab"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/internal/testutil"
)

// TestRealDockerEngine runs a real dockerd (and its containerd) inside a
// network namespace with a real carve agent, lets the engine loop create the
// Docker networks on carve's bridges (named after the overlays, as DC/OS
// names them, on the bridges d-<overlay>), runs a container on carve and checks
// that its address comes from, and goes back to, the agent's IPAM.
//
// Containment: dockerd runs in the lab's host namespace (its bridges and
// routes stay there; it runs with --iptables=false, so it adds no rules at
// all), in a private mount namespace with that namespace's own /sys, and
// with its own data, exec and containerd state directories; its cgroups live
// under a parent named after this test process. Only processes this test
// started are stopped, by PID. The root namespace's links, routes and
// firewall are compared before and after.
func TestRealDockerEngine(t *testing.T) {
	if !netnslab.IsRoot() {
		t.Skip("needs root: network namespaces and a Docker engine")
	}
	bins := map[string]string{}
	for _, b := range []string{"dockerd", "containerd", "containerd-shim-runc-v2", "runc", "mount", "umount"} {
		p, err := exec.LookPath(b)
		if err != nil {
			t.Skipf("%s not found (install Debian's docker.io): %v", b, err)
		}
		bins[b] = p
	}
	busybox, err := staticBusybox()
	if err != nil {
		t.Skipf("no static busybox for the test image (install Debian's busybox-static): %v", err)
	}

	rootBefore := rootState(t)
	t.Cleanup(func() {
		if after := rootState(t); after != rootBefore {
			t.Errorf("the root namespace changed:\n--- before\n%s\n--- after\n%s", rootBefore, after)
		}
	})
	// Host paths dockerd would write to: created here if missing (and then
	// removed again), so that dockerd's private mount namespace can hide
	// them behind a tmpfs. /run/docker/plugins holds the plugin socket.
	keepDir(t, "/run/docker")
	keepDir(t, "/run/docker/plugins")
	keepDir(t, "/run/containerd")
	keepDir(t, "/etc/docker")

	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	host := lab.Hosts()[0]
	a := realAgent(t, host)
	ipam := a.IPAM()
	v4, v6, _ := ipam.BridgeSubnets("carve", api.BridgeDocker)
	gw4, gw6 := v4.Masked().Addr().Next(), v6.Masked().Addr().Next()
	testutil.Eventually(t, waitLimit, "the agent's d-carve bridge with its gateways", testutil.True(func() bool {
		return bridgeHas(t, host, "d-carve", netip.PrefixFrom(gw4, v4.Bits()), netip.PrefixFrom(gw6, v6.Bits()))
	}))

	// The plugin, on a socket Docker discovers, under a name unique to this run.
	driverName := fmt.Sprintf("carve-test-%d", os.Getpid())
	clk := &clock{now: time.Now()}
	dir := shortTempDir(t)
	s := runService(t, ipam, dockeripam.Options{
		PluginSocket: filepath.Join("/run/docker/plugins", driverName+".sock"),
		DockerHost:   "unix://" + filepath.Join(dir, "docker.sock"),
		MTU:          func(string) int { return 1420 },
		EngineRetry:  200 * time.Millisecond, GCInterval: time.Hour, GCGrace: time.Minute, Now: clk.Now,
	})

	d := startDockerd(t, host, dir, bins)
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
	if mtu := linkMTU(t, host, "d-carve"); mtu != 1420 {
		t.Errorf("d-carve MTU %d, want 1420", mtu)
	}

	d.importImage(t, busybox)
	// A container without a network first: if the runtime cannot run
	// containers in this sandbox, that is the sandbox's limit, not carve's.
	probe, err := d.run(t, "none")
	if err != nil {
		t.Skipf("dockerd cannot run containers here: %v", err)
	}
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
	t.Logf("container %.12s on d-carve: %+v", id, ep)
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
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, strings.Split(v, ",")...)
	}
	return out
}

// staticBusybox finds a statically linked busybox (a dynamic one would need
// its libraries in the image).
func staticBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		f.Close()
		if !dynamic {
			return p, nil
		}
		return "", fmt.Errorf("%s is dynamically linked", p)
	}
	return "", errors.New("no busybox in /bin or /usr/bin")
}

// keepDir creates dir if it is missing and removes it again at the end (only
// when this test created it, and only when empty).
func keepDir(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); err == nil {
		return
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove %s, which this test created: %v", dir, err)
		}
	})
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

// dockerd is a Docker engine this test started.
type dockerd struct {
	dir    string
	sock   string
	cmd    *exec.Cmd
	waited chan error
	http   *http.Client
}

// startDockerd starts containerd and dockerd inside host's namespace and
// waits until the engine answers; it skips the test, with dockerd's own
// words, when the daemon cannot start in this sandbox.
func startDockerd(t *testing.T, host *netnslab.Host, dir string, bins map[string]string) *dockerd {
	t.Helper()
	d := &dockerd{dir: dir, sock: filepath.Join(dir, "docker.sock"), waited: make(chan error, 1)}
	d.http = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock)
	}}}
	cgroupParent := fmt.Sprintf("carve-test-%d", os.Getpid())
	for _, sub := range []string{"data", "exec", "containerd", "cg"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ctd := filepath.Join(dir, "containerd")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
`, filepath.Join(ctd, "root"), filepath.Join(ctd, "state"), filepath.Join(ctd, "c.sock"), filepath.Join(ctd, "c.sock.ttrpc"))
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	// Inside a private mount namespace (Unshareflags below): the namespace's
	// own /sys (the cgroup hierarchy bound back in), and tmpfs over the host
	// paths that containerd and dockerd write to regardless of their flags.
	script := fmt.Sprintf(`set -e
D=%q
mount --make-rprivate /
mount --rbind /sys/fs/cgroup "$D/cg"
mount -t sysfs sysfs /sys
mount --rbind "$D/cg" /sys/fs/cgroup
umount -l "$D/cg"
mount -t tmpfs -o mode=0711 carve-test /run/containerd
mount -t tmpfs -o mode=0755 carve-test /etc/docker
%q --config "$D/containerd.toml" >"$D/containerd.log" 2>&1 &
echo $! >"$D/containerd.pid"
exec %q --data-root "$D/data" --exec-root "$D/exec" --pidfile "$D/dockerd.pid" \
  --host "unix://$D/docker.sock" --containerd "$D/containerd/c.sock" \
  --bridge=none --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
  --storage-driver=vfs --cgroup-parent=/%s >"$D/dockerd.log" 2>&1
`, dir, bins["containerd"], bins["dockerd"], cgroupParent)
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command("/bin/sh", filepath.Join(dir, "run.sh"))
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	d.cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bins["runc"])+":"+filepath.Dir(bins["containerd-shim-runc-v2"])+":/usr/sbin:/usr/bin:/sbin:/bin")
	if err := host.Start(d.cmd); err != nil {
		t.Fatalf("start dockerd: %v", err)
	}
	go func() { d.waited <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t, host, cgroupParent) })

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	err := retry.Until(ctx, 100*time.Millisecond, func() error {
		select {
		case err := <-d.waited:
			d.waited <- err
			return retry.Permanent(fmt.Errorf("it exited (%v)", err))
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		req, _ := http.NewRequestWithContext(pctx, http.MethodGet, "http://docker/_ping", nil)
		resp, err := d.http.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("ping: HTTP %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		t.Skipf("dockerd cannot run here: %v: %s", err, daemonError(filepath.Join(dir, "dockerd.log")))
	}
	return d
}

// daemonError is the reason a daemon gives in its log for failing.
func daemonError(log string) string {
	data, _ := os.ReadFile(log)
	var last string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "level=fatal") || strings.Contains(l, "level=error") || strings.HasPrefix(l, "failed to start daemon") {
			last = l
		}
	}
	if last == "" {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		last = lines[len(lines)-1]
	}
	return last
}

// stop removes the containers, stops dockerd and containerd by PID, kills
// what they left in the namespace (shims and their children, by PID), and
// removes the cgroups and directories.
func (d *dockerd) stop(t *testing.T, host *netnslab.Host, cgroupParent string) {
	t.Helper()
	var ids []struct {
		ID string `json:"Id"`
	}
	if d.try(http.MethodGet, "/containers/json?all=1", nil, &ids) == nil {
		for _, c := range ids {
			_ = d.try(http.MethodDelete, "/containers/"+c.ID+"?force=1", nil, nil)
		}
	}
	ctdPID := readPID(filepath.Join(d.dir, "containerd.pid"))
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.waited:
	case <-time.After(30 * time.Second):
		t.Errorf("dockerd (pid %d) ignored SIGTERM for 30s; killing it", d.cmd.Process.Pid)
		_ = d.cmd.Process.Kill()
		<-d.waited
	}
	if ctdPID > 0 && isRunning(ctdPID) {
		_ = syscall.Kill(ctdPID, syscall.SIGTERM)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			if isRunning(ctdPID) {
				return errors.New("still running")
			}
			return nil
		})
		cancel()
		if err != nil {
			t.Errorf("containerd (pid %d) ignored SIGTERM for 30s; killing it", ctdPID)
			_ = syscall.Kill(ctdPID, syscall.SIGKILL)
		}
	}
	if left := processesIn(t, host); len(left) > 0 {
		t.Logf("killing what the daemons left in the namespace: %v", left)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, pattern := range []string{"/sys/fs/cgroup/" + cgroupParent, "/sys/fs/cgroup/*/" + cgroupParent} {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			removeCgroup(t, m)
		}
	}
	if t.Failed() {
		for _, l := range []string{"dockerd.log", "containerd.log"} {
			data, _ := os.ReadFile(filepath.Join(d.dir, l))
			if len(data) > 8000 {
				data = data[len(data)-8000:]
			}
			t.Logf("%s (tail):\n%s", l, data)
		}
	}
	// The daemons' mounts lived in their own mount namespace, gone with
	// them: nothing under the directory is mounted here.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), d.dir) {
		t.Errorf("mounts under %s leaked into the test's mount namespace", d.dir)
		return
	}
	if err := os.RemoveAll(d.dir); err != nil {
		t.Errorf("remove %s: %v", d.dir, err)
	}
}

func readPID(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

func isRunning(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie (state Z) has exited; its parent has yet to reap it.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// processesIn lists the processes in host's network namespace and their
// descendants (containers live in namespaces of their own, under shims that
// live in host's): all of them were started by this test's daemons.
func processesIn(t *testing.T, host *netnslab.Host) []int {
	t.Helper()
	ino, err := host.Inode()
	if err != nil {
		t.Errorf("namespace inode: %v", err)
		return nil
	}
	want := fmt.Sprintf("net:[%d]", ino)
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	var roots []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && l == want && isRunning(pid) {
			roots = append(roots, pid)
		}
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
			if len(f) > 1 {
				parent[pid], _ = strconv.Atoi(f[1])
			}
		}
	}
	out := slices.Clone(roots)
	for changed := true; changed; {
		changed = false
		for pid, ppid := range parent {
			if slices.Contains(out, ppid) && !slices.Contains(out, pid) && isRunning(pid) {
				out = append(out, pid)
				changed = true
			}
		}
	}
	return out
}

// removeCgroup removes a cgroup directory of this test, children first.
func removeCgroup(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeCgroup(t, filepath.Join(dir, e.Name()))
		}
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("remove cgroup %s: %v", dir, err)
	}
}

// try makes an engine call and reports failure as an error.
func (d *dockerd) try(method, path string, in io.Reader, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, in)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		var m struct{ Message string }
		if json.Unmarshal(data, &m) == nil && m.Message != "" {
			return errors.New(m.Message)
		}
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (d *dockerd) call(t *testing.T, method, path string, in any, out any) {
	t.Helper()
	var body io.Reader
	if in != nil {
		data, _ := json.Marshal(in)
		body = bytes.NewReader(data)
	}
	if err := d.try(method, path, body, out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
}

// importImage imports carve-busybox:test, a root file system holding only a
// static busybox (no registry is reachable from a test).
func (d *dockerd) importImage(t *testing.T, busybox string) {
	t.Helper()
	bin, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}))
	must(tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))}))
	_, err = tw.Write(bin)
	must(err)
	for _, l := range []string{"sh", "sleep"} {
		must(tw.WriteHeader(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}))
	}
	must(tw.Close())
	q := url.Values{"fromSrc": {"-"}, "repo": {"carve-busybox"}, "tag": {"test"}}
	req, err := http.NewRequest(http.MethodPost, "http://docker/images/create?"+q.Encode(), &buf)
	must(err)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := d.http.Do(req)
	must(err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || bytes.Contains(data, []byte(`"errorDetail"`)) {
		t.Fatalf("import image: HTTP %d %s", resp.StatusCode, data)
	}
}

// run creates and starts a sleeping container on a network.
func (d *dockerd) run(t *testing.T, network string) (string, error) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"Image": "carve-busybox:test", "Cmd": []string{"/bin/sleep", "600"},
		"HostConfig": map[string]any{"NetworkMode": network},
	})
	var created struct {
		ID string `json:"Id"`
	}
	if err := d.try(http.MethodPost, "/containers/create", bytes.NewReader(body), &created); err != nil {
		return "", fmt.Errorf("create: %w", err)
	}
	if err := d.try(http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		_ = d.try(http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, nil)
		return "", fmt.Errorf("start: %w", err)
	}
	return created.ID, nil
}

func (d *dockerd) remove(t *testing.T, id string) {
	t.Helper()
	if err := d.try(http.MethodDelete, "/containers/"+id+"?force=1", nil, nil); err != nil {
		t.Fatalf("remove container %.12s: %v", id, err)
	}
}
