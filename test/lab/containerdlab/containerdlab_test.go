package containerdlab

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// debianCNI is where Debian's containernetworking-plugins installs.
const debianCNI = "/usr/lib/cni"

// requirePrerequisites stops the test when the machine lacks what a lab
// containerd needs, saying what (testutil.Require: a skip, a failure under
// CI).
func requirePrerequisites(t *testing.T) {
	t.Helper()
	var missing []string
	if !netnslab.IsRoot() {
		missing = append(missing, "root (network and mount namespaces)")
	}
	if _, err := Binaries(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := enginelab.StaticBusybox(); err != nil {
		missing = append(missing, err.Error())
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(debianCNI, p)); err != nil {
			missing = append(missing, fmt.Sprintf("%s/%s (install Debian's containernetworking-plugins)", debianCNI, p))
		}
	}
	testutil.Require(t, len(missing) == 0, "containerdlab: missing %s", strings.Join(missing, "; "))
}

// spyPlugin is a bin_dir entry that records the CNI environment and the
// config of each call, one JSON line each, then runs the real plugin.
const spyPlugin = `#!/bin/sh
in=$(cat)
printf '{"command":"%%s","containerID":"%%s","ifname":"%%s","args":"%%s","netns":"%%s","config":%%s}\n' \
  "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_NETNS" "$in" >>%q
printf '%%s' "$in" | exec %q
`

// cniCall is one line of the spy's log.
type cniCall struct {
	Command, ContainerID, IfName, Args, NetNS string
	Config                                    struct {
		CNIVersion    string         `json:"cniVersion"`
		Name          string         `json:"name"`
		RuntimeConfig map[string]any `json:"runtimeConfig"`
	}
}

// hasArgs reports whether CNI_ARGS (K=V pairs joined by ';', in any
// order: go-cni builds them from a map) hold every pair of want.
func hasArgs(args string, want map[string]string) bool {
	got := map[string]string{}
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TestPodLifecycle runs Debian's containerd with its CRI plugin in a lab
// host and a plain bridge + host-local conflist (Debian's plugins, spec
// 1.0.0): a pod gets an address from the range and reaches the bridge's
// gateway; containerd killed with SIGKILL and started again finds the pod
// still ready and reachable; stopping and removing pods calls DEL, which
// releases their addresses; and the cleanup leaves nothing behind.
func TestPodLifecycle(t *testing.T) {
	requirePrerequisites(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := netnslab.EnsureNetNSDir(); err != nil {
		t.Fatal(err)
	}

	work := t.TempDir()
	crictl, err := labcluster.BuildTool(ctx, work, "sigs.k8s.io/cri-tools/cmd/crictl")
	if err != nil {
		t.Fatal(err)
	}
	confDir, binDir, ipamDir := filepath.Join(work, "net.d"), filepath.Join(work, "bin"), filepath.Join(work, "ipam")
	for _, d := range []string{confDir, binDir, ipamDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Debian's plugins, bridge through the spy.
	spyLog := filepath.Join(work, "cni-calls.jsonl")
	for _, p := range []string{"host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(debianCNI, p), filepath.Join(binDir, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(binDir, "bridge"), fmt.Appendf(nil, spyPlugin, spyLog, filepath.Join(debianCNI, "bridge")), 0o755); err != nil {
		t.Fatal(err)
	}
	const network = "labnet"
	subnet, gateway := netip.MustParsePrefix("10.88.7.0/24"), netip.MustParseAddr("10.88.7.1")
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}
  }]
}`, network, subnet, ipamDir)
	if err := os.WriteFile(filepath.Join(confDir, "10-labnet.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	// Registered before Start, so it runs after Start's cleanup: every
	// address host-local handed out was released by a DEL.
	t.Cleanup(func() {
		entries, _ := os.ReadDir(filepath.Join(ipamDir, network))
		for _, e := range entries {
			if _, err := netip.ParseAddr(e.Name()); err == nil {
				t.Errorf("host-local still holds %s after the pods were removed", e.Name())
			}
		}
	})

	var dir string // the daemon's, checked after Start's cleanup
	t.Cleanup(func() {
		if _, err := os.Stat(dir); dir != "" && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the daemon's directory %s is still there (%v)", dir, err)
		}
	})
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	host := lab.Hosts()[0]
	begin := time.Now()
	ctd, err := Start(ctx, t, host, Options{CNIConfDir: confDir, CNIBinDir: binDir, Crictl: crictl})
	if err != nil {
		t.Fatal(err)
	}
	dir = ctd.Dir()
	t.Logf("containerd ready in %s", time.Since(begin).Round(time.Millisecond))
	defer func() {
		if t.Failed() {
			t.Log(ctd.LogTail(4000))
		}
	}()

	// reachable checks the pod's address and pings the gateway from it.
	reachable := func(podID string) netip.Addr {
		t.Helper()
		ip, err := ctd.PodIP(ctx, podID)
		if err != nil {
			t.Fatal(err)
		}
		if !subnet.Contains(ip) || ip == gateway {
			t.Fatalf("pod %.12s has %s, want an address of %s other than the gateway", podID, ip, subnet)
		}
		testutil.Eventually(t, 20*time.Second, "a ping from the pod to the gateway", func() error {
			_, err := ctd.Exec(ctx, podID, "/bin/busybox", "ping", "-c", "1", "-W", "2", gateway.String())
			return err
		})
		return ip
	}

	web, err := ctd.RunPod(ctx, "web", "default")
	if err != nil {
		t.Fatal(err)
	}
	webIP := reachable(web)

	calls := testutil.JSONLines[cniCall](t, spyLog)
	if len(calls) != 1 || calls[0].Command != "ADD" {
		t.Fatalf("CNI calls after runp = %+v, want one ADD", calls)
	}
	add := calls[0]
	wantArgs := map[string]string{
		"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "web",
		"K8S_POD_INFRA_CONTAINER_ID": web, "K8S_POD_UID": podUID("web", "default"),
	}
	if add.ContainerID != web || add.IfName != "eth0" || !hasArgs(add.Args, wantArgs) || add.Config.CNIVersion != "1.0.0" || add.Config.Name != network {
		t.Errorf("ADD = %+v, want container %s, eth0, CNI_ARGS with %v, cniVersion 1.0.0, name %s", add, web, wantArgs, network)
	}
	t.Logf("ADD: CNI_ARGS=%q CNI_NETNS=%q runtimeConfig=%v", add.Args, add.NetNS, add.Config.RuntimeConfig)

	// A crash: the pod outlives containerd, and the restarted daemon finds
	// it through its shim.
	oldPID := ctd.PID()
	if err := ctd.Kill9(); err != nil {
		t.Fatal(err)
	}
	if err := ctd.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if ctd.PID() == oldPID {
		t.Fatalf("containerd restarted with the same pid %d", oldPID)
	}
	p, err := ctd.InspectPod(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.State != "SANDBOX_READY" {
		t.Fatalf("after kill -9 and restart, pod web is %s, want SANDBOX_READY", p.Status.State)
	}
	if got := reachable(web); got != webIP {
		t.Errorf("after restart, pod web has %s, want %s", got, webIP)
	}
	if n := len(testutil.JSONLines[cniCall](t, spyLog)); n != 1 {
		t.Errorf("restart made CNI calls: %d in all, want the one ADD", n)
	}

	// Stop and remove on the restarted daemon: DEL, the address released.
	if err := ctd.StopPod(ctx, web); err != nil {
		t.Fatal(err)
	}
	stopCalls := testutil.JSONLines[cniCall](t, spyLog)[1:]
	if len(stopCalls) != 1 || stopCalls[0].Command != "DEL" || stopCalls[0].ContainerID != web || !hasArgs(stopCalls[0].Args, wantArgs) || stopCalls[0].NetNS != add.NetNS {
		t.Errorf("CNI calls of stopp = %+v, want one DEL of %s in %s with CNI_ARGS with %v", stopCalls, web, add.NetNS, wantArgs)
	}
	if err := ctd.RemovePod(ctx, web); err != nil {
		t.Fatal(err)
	}
	// containerd 1.6 tears the network down again on rmp: a second DEL,
	// which a plugin must answer with success (CNI: DEL is idempotent).
	rmCalls := testutil.JSONLines[cniCall](t, spyLog)[2:]
	if len(rmCalls) != 1 || rmCalls[0].Command != "DEL" || rmCalls[0].ContainerID != web {
		t.Errorf("CNI calls of rmp = %+v, want a second DEL of %s", rmCalls, web)
	} else {
		t.Logf("second DEL (rmp): CNI_NETNS=%q", rmCalls[0].NetNS)
	}
	if _, err := os.Stat(filepath.Join(ipamDir, network, webIP.String())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host-local still holds %s after DEL (%v)", webIP, err)
	}

	// A second pod on the restarted daemon, left for the cleanup to remove.
	db, err := ctd.RunPod(ctx, "db", "prod")
	if err != nil {
		t.Fatal(err)
	}
	reachable(db)
	var seq []string
	for _, c := range testutil.JSONLines[cniCall](t, spyLog) {
		seq = append(seq, c.Command+" "+c.ContainerID[:12])
	}
	t.Logf("CNI calls: %s; test body %s", strings.Join(seq, ", "), time.Since(begin).Round(time.Millisecond))
}

// TestPauseArchive checks the image layout ctr imports: an index naming
// PauseImage for this platform, a manifest whose config sleeps for ever
// on the busybox layer, every blob under its digest.
func TestPauseArchive(t *testing.T) {
	layer := []byte("not really a tar")
	archive, err := pauseArchive(layer)
	if err != nil {
		t.Fatal(err)
	}
	files := untar(t, archive)
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	mustJSON(t, files["index.json"], &index)
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != PauseImage {
		t.Fatalf("index = %+v, want one manifest named %s", index, PauseImage)
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	mustJSON(t, blobOf(t, files, index.Manifests[0].Digest), &manifest)
	var config struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	mustJSON(t, blobOf(t, files, manifest.Config.Digest), &config)
	if got := strings.Join(config.Config.Entrypoint, " "); got != "/bin/sleep 2147483647" {
		t.Errorf("entrypoint = %q", got)
	}
	if len(manifest.Layers) != 1 || string(blobOf(t, files, manifest.Layers[0].Digest)) != string(layer) ||
		len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Errorf("layers = %+v, diff_ids = %v: want the one layer, uncompressed", manifest.Layers, config.RootFS.DiffIDs)
	}
}

func blobOf(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	data, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob %s", digest)
	}
	if got := (blob{data: data}).digest(); got != digest {
		t.Fatalf("blob %s has digest %s", digest, got)
	}
	return data
}

func mustJSON(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
}

func untar(t *testing.T, archive []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
}

// TestImageArchiveNames checks that an image is imported under the full
// reference critest asks for, with its tag as the OCI ref name.
func TestImageArchiveNames(t *testing.T) {
	for _, tc := range []struct{ name, tag string }{
		{CritestBusyboxImage, "1.29-2"},
		{CritestWebServerImage, "1.14-2"},
		{CritestHostNetWebServerImage, "latest"},
		{"localhost:5000/busybox", "latest"},
		{"localhost:5000/busybox:1", "1"},
		{PauseImage, "lab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			archive, err := imageArchive(tc.name, []byte("layer"), map[string]any{"Cmd": []string{"sh"}})
			if err != nil {
				t.Fatal(err)
			}
			var index struct {
				Manifests []struct{ Annotations map[string]string }
			}
			mustJSON(t, untar(t, archive)["index.json"], &index)
			if len(index.Manifests) != 1 {
				t.Fatalf("index = %+v, want one manifest", index)
			}
			a := index.Manifests[0].Annotations
			if a["io.containerd.image.name"] != tc.name || a["org.opencontainers.image.ref.name"] != tc.tag {
				t.Errorf("annotations %v, want name %s, ref name %s", a, tc.name, tc.tag)
			}
		})
	}
}
