package podmanlab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// recorderPlugin is the name under which the test binary is a chained CNI
// plugin that records every call (see TestMain).
const recorderPlugin = "carve-lab-recorder"

// TestMain makes the test binary a CNI plugin when Podman runs it under
// recorderPlugin's name: it appends the call to calls.log beside its
// plugin directory and passes the previous result on.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == recorderPlugin {
		os.Exit(recordCNICall(os.Args[0]))
	}
	os.Exit(m.Run())
}

// cniCall is one line of calls.log.
type cniCall struct {
	Command, ContainerID, IfName, Netns, Args string
}

func recordCNICall(self string) int {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return 1
	}
	cmd := os.Getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		fmt.Print(`{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}`)
		return 0
	}
	line, _ := json.Marshal(cniCall{cmd, os.Getenv("CNI_CONTAINERID"), os.Getenv("CNI_IFNAME"), os.Getenv("CNI_NETNS"), os.Getenv("CNI_ARGS")})
	f, err := os.OpenFile(filepath.Join(filepath.Dir(filepath.Dir(self)), "calls.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "recorder: %v", err)
		return 1
	}
	_, err = f.Write(append(line, '\n'))
	f.Close()
	if err != nil {
		return 1
	}
	if cmd == "ADD" {
		var conf struct {
			PrevResult json.RawMessage `json:"prevResult"`
		}
		if err := json.Unmarshal(in, &conf); err != nil || conf.PrevResult == nil {
			fmt.Fprintf(os.Stderr, "recorder: no prevResult in %s", in)
			return 1
		}
		os.Stdout.Write(conf.PrevResult)
	}
	return 0
}

// labnet is the test's network: Debian's bridge and host-local at spec
// 1.0.0, then the recorder.
const labnet = `{
  "cniVersion": "1.0.0",
  "name": "labnet",
  "plugins": [
    {
      "type": "bridge", "bridge": "labbr0", "isGateway": true, "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.89.7.0/24", "rangeStart": "10.89.7.10", "rangeEnd": "10.89.7.99", "gateway": "10.89.7.1"}]]
      }
    },
    {"type": "carve-lab-recorder"}
  ]
}`

// TestPodmanOnCNINetwork runs Podman in a lab host on a plain CNI network:
// a container gets an address from host-local's range and pings the
// bridge; --ip gets the requested address (IP= in CNI_ARGS, with the
// container's name as K8S_POD_NAME); `podman rm -f` calls DEL and frees the
// address; a container that ends by itself is torn down by the cleanup
// that conmon runs.
func TestPodmanOnCNINetwork(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(plugins, recorderPlugin)); err != nil {
		t.Fatal(err)
	}
	pm := New(t, lab.Hosts()[0], Options{Dir: filepath.Join(dir, "podman"), CNIPluginDirs: []string{DebianCNIPluginDir, plugins}})
	if err := os.WriteFile(filepath.Join(pm.ConfDir(), "labnet.conflist"), []byte(labnet), 0o644); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(dir, "calls.log")
	leases := filepath.Join(pm.VarLib(), "cni", "networks", "labnet")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gateway := netip.MustParseAddr("10.89.7.1")
	first, last := netip.MustParseAddr("10.89.7.10"), netip.MustParseAddr("10.89.7.99")

	for _, tc := range []struct {
		name, ip string
	}{
		{name: "dynamic"},
		{name: "requested", ip: "10.89.7.77"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := pm.Run(ctx, tc.name, "labnet", tc.ip)
			if err != nil {
				t.Fatal(err)
			}
			ip, err := pm.IP(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if tc.ip != "" && ip.String() != tc.ip {
				t.Errorf("address %s, requested %s", ip, tc.ip)
			}
			if ip.Less(first) || last.Less(ip) {
				t.Errorf("address %s outside host-local's range %s-%s", ip, first, last)
			}
			lease, err := os.ReadFile(filepath.Join(leases, ip.String()))
			if err != nil || !strings.HasPrefix(string(lease), id) {
				t.Errorf("host-local's lease for %s: %q, %v; want container %s", ip, lease, err, id)
			}
			out, code, err := pm.Exec(ctx, id, "ping", "-c", "1", "-W", "5", gateway.String())
			if err != nil || code != 0 {
				t.Errorf("ping %s from the container: exit %d, %v: %s", gateway, code, err, out)
			}
			wantArgs := "IgnoreUnknown=1;K8S_POD_NAME=" + tc.name
			if tc.ip != "" {
				wantArgs += ";IP=" + tc.ip
			}
			add := lastCall(testutil.JSONLines[cniCall](t, calls), "ADD", id)
			if add == nil || add.Args != wantArgs || add.IfName != "eth0" || add.Netns == "" {
				t.Errorf("ADD as the plugin saw it: %+v; want CNI_ARGS %q, eth0, a netns path", add, wantArgs)
			}
			t.Logf("ADD: %+v", *add)

			if err := pm.Remove(ctx, id); err != nil {
				t.Fatal(err)
			}
			if del := lastCall(testutil.JSONLines[cniCall](t, calls), "DEL", id); del == nil || del.Args != wantArgs {
				t.Errorf("DEL as the plugin saw it: %+v; want CNI_ARGS %q", del, wantArgs)
			}
			if _, err := os.Stat(filepath.Join(leases, ip.String())); !os.IsNotExist(err) {
				t.Errorf("host-local still holds %s after podman rm -f (%v)", ip, err)
			}
		})
	}

	t.Run("exits", func(t *testing.T) {
		id, err := pm.Run(ctx, "exits", "labnet", "", "/bin/sh", "-c", "exit 0")
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "DEL from conmon's cleanup", func() error {
			if del := lastCall(testutil.JSONLines[cniCall](t, calls), "DEL", id); del == nil {
				return fmt.Errorf("no DEL for %.12s yet", id)
			}
			return nil
		})
		if del := lastCall(testutil.JSONLines[cniCall](t, calls), "DEL", id); del.Args != "IgnoreUnknown=1;K8S_POD_NAME=exits" {
			t.Errorf("DEL from the cleanup: CNI_ARGS %q", del.Args)
		}
		if err := pm.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	})
}

func lastCall(calls []cniCall, command, id string) *cniCall {
	for i := len(calls) - 1; i >= 0; i-- {
		if calls[i].Command == command && calls[i].ContainerID == id {
			return &calls[i]
		}
	}
	return nil
}
