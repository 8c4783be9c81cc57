package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/containerdlab"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/podmanlab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestEngines is issue 18's drop-in scenario: carve under the engines people
// run, on one two-host cluster whose hosts are stock Debian ones: the
// agents' --cni-bin-dir holds Debian's plugins 1.1.1 (/usr/lib/cni) and
// carve-ipam, put there by `carve install-cni`, and Debian's containerd
// 1.6.20 and Podman 4.3.1 (libcni 1.1) are on the machine. The agents run
// with --cni-version auto.
//
//  1. version: every agent chose spec 1.0.0, logged why, and wrote its
//     conflist in it.
//  2. containerd: one containerd (CRI, driven with crictl as a kubelet
//     would) per host, its conf_dir the agent's --cni-conf-dir and its
//     bin_dir that plugin directory: pods on the two hosts get addresses of
//     their host's bridge and ping each other; stopp releases the address
//     and rmp's second DEL (empty CNI_NETNS) succeeds; a pod whose
//     containerd is killed with SIGKILL and removed after the restart leaks
//     nothing (`carve ipam check` clean).
//  3. podman: a Podman container on the network named after the overlay
//     gets an address of its host's bridge and pings a CNI container on the
//     other host.
//  4. nomad: Nomad's calls through go-cni (see nomad_test.go).
func TestEngines(t *testing.T) {
	requireEngines(t)
	work := t.TempDir()
	plugins := debianPluginDir(t, work)
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix,
		CNIVersion: "auto", CNIBinDirs: []string{plugins}})
	const overlay = "carve"
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	step("version", func(t *testing.T) {
		ctx := within(t, converge)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for _, h := range c.Hosts() {
			requireConflistVersion(ctx, t, h, overlay, netconf.BaseCNIVersion)
			log, err := os.ReadFile(h.Agent.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			line := grepLine(string(log), `msg="CNI spec version chosen"`)
			if !strings.Contains(line, "version="+netconf.BaseCNIVersion) || !strings.Contains(line, "supports up to 1.0.0") {
				t.Errorf("%s's agent logged %q; want version %s because Debian's bridge supports up to 1.0.0", h.Name, line, netconf.BaseCNIVersion)
			}
			t.Logf("%s: %s", h.Name, line)
		}
	})
	step("containerd", func(t *testing.T) { containerdPods(t, c, work, plugins, overlay) })
	step("podman", func(t *testing.T) { podmanContainer(t, c, work, plugins, overlay) })
	step("nomad", func(t *testing.T) { nomadCalls(t, c, overlay) })
}

// requireEngines stops the test when the machine lacks an engine or
// Debian's plugins (testutil.Require: a skip, a failure under CI).
func requireEngines(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := containerdlab.Binaries(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := podmanlab.Binaries(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := enginelab.StaticBusybox(); err != nil {
		missing = append(missing, err.Error())
	}
	for _, p := range []string{"bridge", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(netconf.DebianBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(netconf.DebianBinDir, p)+" (apt-get install containernetworking-plugins)")
		}
	}
	testutil.Require(t, len(missing) == 0, "e2e: engines: missing %s (deploy/install-deps.sh installs them)", strings.Join(missing, "; "))
}

// debianPluginDir is a stock Debian host's plugin directory filled as
// docs/operations.md, section 4, says: the real `carve install-cni` puts
// carve-ipam there and copies what it lacks of Debian's bridge, portmap
// and loopback (which containerd's CRI runs for every pod's lo; issue 28:
// it was left out, and the first pod failed with failed to find plugin
// "loopback"). host-local is no plugin of carve's (the engines' own
// networks use it).
func debianPluginDir(t *testing.T, work string) string {
	t.Helper()
	dir := filepath.Join(work, "cni-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(netconf.DebianBinDir, "host-local"), filepath.Join(dir, "host-local")); err != nil {
		t.Fatal(err)
	}
	from, err := labcluster.FindCNIPlugins(filepath.SplitList(os.Getenv(labcluster.CNIPathEnv))...)
	if err != nil || len(from) == 0 {
		t.Fatalf("carve-ipam: %v (labcluster.RunTests builds it)", err)
	}
	var src string
	for _, d := range from {
		if _, err := os.Stat(filepath.Join(d, netconf.PluginType)); err == nil {
			src = d
		}
	}
	out, err := exec.Command(os.Getenv(labcluster.BinaryEnv), "install-cni", "--bin-dir", dir, "--from", src, "--plugins-from", netconf.DebianBinDir).CombinedOutput()
	if err != nil {
		t.Fatalf("carve install-cni: %v: %s", err, out)
	}
	t.Logf("carve install-cni: %s", strings.TrimSpace(string(out)))
	return dir
}

// requireConflistVersion waits for h's agent's conflist of overlay and
// checks the spec version it declares.
func requireConflistVersion(ctx context.Context, t *testing.T, h *labcluster.Host, overlay, want string) {
	t.Helper()
	path := netconf.ConflistPath(h.CNIConfDir(), "", overlay)
	var got struct {
		CNIVersion string `json:"cniVersion"`
	}
	testutil.Eventually(t, time.Until(deadline(ctx)), "the conflist "+path, func() error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return json.Unmarshal(data, &got)
	})
	if got.CNIVersion != want {
		t.Errorf("%s says cniVersion %q, want %q", path, got.CNIVersion, want)
	}
}

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(converge)
	}
	return d
}

func grepLine(text, substr string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}

// containerdPods is TestEngines' step 2.
func containerdPods(t *testing.T, c *labcluster.Cluster, work, plugins, overlay string) {
	ctx := within(t, 6*time.Minute)
	crictl, err := labcluster.BuildTool(ctx, work, "sigs.k8s.io/cri-tools/cmd/crictl")
	if err != nil {
		t.Fatal(err)
	}
	type pod struct {
		ctd  *containerdlab.Containerd
		host *labcluster.Host
		id   string
		ip   netip.Addr
	}
	var pods []pod
	for _, h := range c.Hosts() {
		ctd, err := containerdlab.Start(ctx, t, h.NS, containerdlab.Options{CNIConfDir: h.CNIConfDir(), CNIBinDir: plugins, Crictl: crictl})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if t.Failed() {
				t.Log(ctd.LogTail(3000))
			}
		}()
		id, err := ctd.RunPod(ctx, "web-"+h.Name, "default")
		if err != nil {
			t.Fatal(err)
		}
		ip, err := ctd.PodIP(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := onBridge(ip, mesosBridge(ctx, t, c, h, overlay)); err != nil {
			t.Fatalf("pod on %s: %v", h.Name, err)
		}
		if got := allocations(ctx, t, c, h, overlay)[types.GCAttachment{ContainerID: id, IfName: "eth0"}]; got.Addr() != ip {
			t.Fatalf("%s's agent holds %v for pod %.12s/eth0, want %s", h.Name, got, id, ip)
		}
		pods = append(pods, pod{ctd, h, id, ip})
		t.Logf("pod %.12s on %s: %s", id, h.Name, ip)
	}
	for i, p := range pods {
		other := pods[1-i]
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("a ping from the pod on %s to the pod on %s", p.host.Name, other.host.Name), func() error {
			_, err := p.ctd.Exec(ctx, p.id, "/bin/busybox", "ping", "-c", "1", "-W", "2", other.ip.String())
			return err
		})
	}
	for _, p := range pods {
		if err := p.ctd.StopPod(ctx, p.id); err != nil {
			t.Fatal(err)
		}
		if a, held := allocations(ctx, t, c, p.host, overlay)[types.GCAttachment{ContainerID: p.id, IfName: "eth0"}]; held {
			t.Errorf("after stopp, %s's agent still holds %s for pod %.12s", p.host.Name, a, p.id)
		}
		// containerd 1.6 sends DEL again on rmp, with an empty CNI_NETNS:
		// rmp fails unless it succeeds.
		if err := p.ctd.RemovePod(ctx, p.id); err != nil {
			t.Fatal(err)
		}
	}

	// A crash: containerd killed with SIGKILL while a pod runs, restarted,
	// and the pod removed then.
	p := pods[0]
	id, err := p.ctd.RunPod(ctx, "crash", "default")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ctd.Kill9(); err != nil {
		t.Fatal(err)
	}
	if err := p.ctd.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, string) error{p.ctd.StopPod, p.ctd.RemovePod} {
		if err := step(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range c.Hosts() {
		if got := allocations(ctx, t, c, h, overlay); len(got) != 0 {
			t.Errorf("%s's agent still holds %v after every pod was removed", h.Name, got)
		}
	}
	if rep, code := ipamCheck(ctx, t, c); code != 0 || !rep.Clean {
		t.Errorf("carve ipam check after the pods: exit %d, clean %v, problems %+v", code, rep.Clean, rep.Problems)
	}
}

// podmanContainer is TestEngines' step 3.
func podmanContainer(t *testing.T, c *labcluster.Cluster, work, plugins, overlay string) {
	ctx := within(t, 3*time.Minute)
	h, other := c.Host(1), c.Host(2)
	target, err := c.AddCNIContainer(ctx, other, overlay, labcluster.CNIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.DelCNIContainer(context.Background(), target); err != nil {
			t.Errorf("DEL of %s: %v", target.Name, err)
		}
	})
	pm := podmanlab.New(t, h.NS, podmanlab.Options{Dir: filepath.Join(work, "podman"),
		CNIConfDir: h.CNIConfDir(), CNIPluginDirs: []string{plugins}})
	id, err := pm.Run(ctx, "web", overlay, "")
	if err != nil {
		t.Fatal(err)
	}
	ip, err := pm.IP(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := onBridge(ip, mesosBridge(ctx, t, c, h, overlay)); err != nil {
		t.Fatalf("Podman container on %s: %v", h.Name, err)
	}
	if got := allocations(ctx, t, c, h, overlay)[types.GCAttachment{ContainerID: id, IfName: "eth0"}]; got.Addr() != ip {
		t.Errorf("%s's agent holds %v for %.12s/eth0, want %s", h.Name, got, id, ip)
	}
	testutil.Eventually(t, 30*time.Second, "a ping from the Podman container to "+target.Name+" on "+other.Name, func() error {
		out, code, err := pm.Exec(ctx, id, "ping", "-c", "1", "-W", "2", target.Addr.Addr().String())
		if err != nil || code != 0 {
			return errors.Join(err, fmt.Errorf("exit %d: %s", code, out))
		}
		return nil
	})
	t.Logf("Podman container %.12s on %s: %s, reaches %s on %s", id, h.Name, ip, target.Addr.Addr(), other.Name)

	// podman run --ip: the address asked for (IP= in CNI_ARGS), exactly;
	// asked again while held, a refusal that names the holder.
	held := allocations(ctx, t, c, h, overlay)
	want := ip
	for {
		want = want.Next()
		if !onBridgeFree(want, held) {
			continue
		}
		break
	}
	pinned, err := pm.Run(ctx, "pinned", overlay, want.String())
	if err != nil {
		t.Fatalf("podman run --ip %s: %v", want, err)
	}
	if got, err := pm.IP(ctx, pinned); err != nil || got != want {
		t.Errorf("podman run --ip %s: the container has %v (%v)", want, got, err)
	}
	if _, err := pm.Run(ctx, "second", overlay, want.String()); err == nil {
		t.Errorf("a second podman run --ip %s succeeded while the address is held", want)
	} else if msg := err.Error(); !strings.Contains(msg, "taken") || !strings.Contains(msg, "pinned") {
		t.Errorf("a second podman run --ip %s: %v; want a refusal saying it is taken by the container pinned", want, err)
	}
	if err := pm.Remove(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if err := pm.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if a, held := allocations(ctx, t, c, h, overlay)[types.GCAttachment{ContainerID: id, IfName: "eth0"}]; held {
		t.Errorf("after podman rm, %s's agent still holds %s", h.Name, a)
	}
}

// onBridgeFree reports whether no attachment holds a.
func onBridgeFree(a netip.Addr, held map[types.GCAttachment]netip.Prefix) bool {
	for _, p := range held {
		if p.Addr() == a {
			return false
		}
	}
	return true
}

// onBridge checks that an engine's container got an address of its host's
// bridge (engines report the address without the prefix).
func onBridge(ip netip.Addr, bridge netip.Prefix) error {
	if !bridge.Masked().Contains(ip) || ip == bridge.Masked().Addr().Next() {
		return fmt.Errorf("address %s is not a container address of the bridge's %s", ip, bridge)
	}
	return nil
}
