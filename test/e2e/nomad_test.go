package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/test/lab/labcluster"
)

// goCNIClientEnv makes the test binary a go-cni client (see TestMain): one
// call as Nomad's client makes it, then exit. A process of its own, started
// inside a lab host's network namespace, because go-cni runs its plugins
// from goroutines of its own, which a namespace entered by one locked
// thread would not hold; and in a mount namespace of its own, because
// go-cni keeps libcni's cache in the fixed /var/lib/cni.
const goCNIClientEnv = "CARVE_E2E_GOCNI_CLIENT"

// goCNICall is what the client is asked to do, on its stdin.
type goCNICall struct {
	Op         string            `json:"op"` // add, check, del
	Conflist   []byte            `json:"conflist"`
	PluginDirs []string          `json:"plugin_dirs"`
	ID         string            `json:"id"`
	NetNS      string            `json:"netns"`
	Labels     map[string]string `json:"labels"`
	Args       map[string]string `json:"args"`
	Ports      []gocni.PortMapping
}

// goCNIAnswer is what it prints.
type goCNIAnswer struct {
	IPs []string `json:"ips,omitempty"`
	Err string   `json:"error,omitempty"`
}

// goCNIClient is the client's main: Nomad's networking_bridge/cni setup
// (nomad/client/allocrunner/networking_cni.go) reduced to its go-cni
// calls: a fresh go-cni instance with the plugin directories and the
// conflist's bytes, interfaces eth0.., then Setup, Check or Remove with
// the allocation's labels as CNI_ARGS and the portMappings capability.
func goCNIClient() int {
	var call goCNICall
	answer := func(a goCNIAnswer) int {
		_ = json.NewEncoder(os.Stdout).Encode(a)
		return 0
	}
	if err := json.NewDecoder(os.Stdin).Decode(&call); err != nil {
		return answer(goCNIAnswer{Err: err.Error()})
	}
	c, err := gocni.New(gocni.WithPluginDir(call.PluginDirs), gocni.WithInterfacePrefix("eth"),
		gocni.WithConfListBytes(call.Conflist))
	if err != nil {
		return answer(goCNIAnswer{Err: "go-cni: " + err.Error()})
	}
	opts := []gocni.NamespaceOpts{gocni.WithLabels(call.Labels), gocni.WithCapabilityPortMap(call.Ports)}
	for k, v := range call.Args {
		opts = append(opts, gocni.WithArgs(k, v))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch call.Op {
	case "add":
		res, err := c.Setup(ctx, call.ID, call.NetNS, opts...)
		if err != nil {
			return answer(goCNIAnswer{Err: err.Error()})
		}
		var a goCNIAnswer
		for _, cfg := range res.Interfaces {
			for _, ipc := range cfg.IPConfigs {
				a.IPs = append(a.IPs, ipc.IP.String())
			}
		}
		return answer(a)
	case "check":
		err = c.Check(ctx, call.ID, call.NetNS, opts...)
	case "del":
		err = c.Remove(ctx, call.ID, call.NetNS, opts...)
	default:
		err = fmt.Errorf("unknown op %q", call.Op)
	}
	if err != nil {
		return answer(goCNIAnswer{Err: err.Error()})
	}
	return answer(goCNIAnswer{})
}

// goCNI runs one go-cni call in a new client process (a client that
// restarted: nothing kept in memory) in h's network namespace, with h's
// CNI cache as its /var/lib/cni.
func goCNI(ctx context.Context, t *testing.T, h *labcluster.Host, call goCNICall) goCNIAnswer {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(call)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.CNICacheDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	// The mount namespace is this command's alone: private mounts, a tmpfs
	// over the machine's /var/lib, the host's cache bound in as /var/lib/cni.
	script := fmt.Sprintf(`set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 carve-lab /var/lib
mkdir /var/lib/cni
mount --bind %q /var/lib/cni
exec %q -test.run=^$`, h.CNICacheDir(), self)
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.Env = append(os.Environ(), goCNIClientEnv+"=1")
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := h.NS.Run(cmd); err != nil {
		t.Fatalf("go-cni client (%s): %v: %s", call.Op, err, stderr.String())
	}
	var a goCNIAnswer
	if err := json.Unmarshal(stdout.Bytes(), &a); err != nil {
		t.Fatalf("go-cni client (%s) printed %q: %v; stderr %s", call.Op, stdout.String(), err, stderr.String())
	}
	return a
}

// newUUID is an allocation id as Nomad makes them.
func newUUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// addNetNS creates a network namespace for an allocation (named with the
// lab's prefix, so that a killed run's leftover is removed by the next),
// as Nomad creates one per allocation, and returns its path.
func addNetNS(t *testing.T, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { delNetNS(name) })
	return filepath.Join("/run/netns", name)
}

func delNetNS(name string) error {
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %w: %s", name, err, out)
	}
	return nil
}

// nomadCalls is TestEngines' step 4: Nomad's calls through go-cni, with the
// reference plugins of the lab (bridge >= 1.3.0: Nomad then CHECKs on
// restore) and the conflist the agent wrote, loaded from its bytes.
//
// An allocation (a UUID, eth0, Nomad's CNI_ARGS, the portMappings
// capability) gets an address of the host's bridge. A client that
// restarted (a new go-cni instance) CHECKs the live namespace: it passes.
// After a simulated reboot (the namespace is gone, carve's state kept),
// CHECK fails cleanly; Nomad then tears the network down and sets it up
// again: the new ADD gets an address, the allocation holds one, and
// `carve ipam check` finds no duplicate.
func nomadCalls(t *testing.T, c *labcluster.Cluster, overlay string) {
	ctx := within(t, 2*time.Minute)
	h := c.Host(2)
	conflist, err := os.ReadFile(filepath.Join(h.CNIConfDir(), overlay+".conflist"))
	if err != nil {
		t.Fatal(err)
	}
	alloc := newUUID(t)
	call := goCNICall{
		Conflist:   conflist,
		PluginDirs: filepath.SplitList(os.Getenv(labcluster.CNIPathEnv)),
		ID:         alloc,
		Labels: map[string]string{
			"IgnoreUnknown": "true", "NOMAD_REGION": "global", "NOMAD_NAMESPACE": "default",
			"NOMAD_JOB_ID": "web", "NOMAD_GROUP_NAME": "web", "NOMAD_ALLOC_ID": alloc,
		},
		Ports: []gocni.PortMapping{{HostPort: 28080, ContainerPort: 8080, Protocol: "tcp"}},
	}
	bridge := mesosBridge(ctx, t, c, h, overlay)
	add := func(ns string) netip.Addr {
		t.Helper()
		call.Op, call.NetNS = "add", ns
		a := goCNI(ctx, t, h, call)
		if a.Err != "" || len(a.IPs) != 1 {
			t.Fatalf("go-cni Setup: %+v; want one address", a)
		}
		ip := netip.MustParseAddr(a.IPs[0])
		if err := onBridge(ip, bridge); err != nil {
			t.Fatalf("allocation %s: %v", alloc, err)
		}
		held := allocations(ctx, t, c, h, overlay)
		if got := held[types.GCAttachment{ContainerID: alloc, IfName: "eth0"}]; got.Addr() != ip {
			t.Fatalf("the agent holds %v for %s/eth0, want %s (all: %v)", got, alloc, ip, held)
		}
		return ip
	}
	check := func() string {
		t.Helper()
		call.Op = "check"
		return goCNI(ctx, t, h, call).Err
	}

	nsName := c.Lab.Prefix() + "nomad-a"
	ip := add(addNetNS(t, nsName))
	t.Logf("allocation %s: %s", alloc, ip)
	for i := range 2 {
		if err := check(); err != "" {
			t.Fatalf("CHECK %d of the live allocation by a restarted client: %s", i+1, err)
		}
	}

	// The reboot: the namespace and its veth are gone, carve's state is not.
	if err := delNetNS(nsName); err != nil {
		t.Fatal(err)
	}
	errText := check()
	if errText == "" {
		t.Fatal("CHECK passed on an allocation whose namespace is gone")
	}
	t.Logf("CHECK after the reboot: %s", errText)
	call.Op = "del"
	if a := goCNI(ctx, t, h, call); a.Err != "" {
		t.Fatalf("go-cni Remove of the namespace gone: %s", a.Err)
	}
	ip2 := add(addNetNS(t, c.Lab.Prefix()+"nomad-b"))
	t.Logf("allocation %s after the reboot: %s (was %s)", alloc, ip2, ip)
	if err := check(); err != "" {
		t.Fatalf("CHECK after the new ADD: %s", err)
	}
	n := 0
	for at := range allocations(ctx, t, c, h, overlay) {
		if at.ContainerID == alloc {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the agent holds %d allocations of %s, want 1", n, alloc)
	}
	if rep, code := ipamCheck(ctx, t, c); code != 0 || !rep.Clean {
		t.Errorf("carve ipam check: exit %d, clean %v, problems %+v", code, rep.Clean, rep.Problems)
	}
	call.Op = "del"
	if a := goCNI(ctx, t, h, call); a.Err != "" {
		t.Fatalf("go-cni Remove: %s", a.Err)
	}
	if held := allocations(ctx, t, c, h, overlay); len(held) != 0 && strings.Contains(fmt.Sprint(held), alloc) {
		t.Errorf("after Remove the agent holds %v", held)
	}
}
