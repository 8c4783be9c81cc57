package cni

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/api"
)

// conflistHasIPs checks that the conflist the agent wrote asks runtimes
// for requested addresses ("capabilities": {"ips": true} on bridge).
func conflistHasIPs(t *testing.T, list *libcni.NetworkConfigList) {
	t.Helper()
	var raw struct {
		Plugins []struct {
			Type         string          `json:"type"`
			Capabilities map[string]bool `json:"capabilities"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw.Plugins) == 0 || raw.Plugins[0].Type != "bridge" || !raw.Plugins[0].Capabilities["ips"] {
		t.Fatalf("the agent's conflist does not give bridge the ips capability:\n%s", list.Bytes)
	}
}

// TestLibcniRequestedAddress asks for addresses the ways runtimes do,
// through libcni and the reference bridge plugin: the "ips" capability
// (containerd, CRI-O), IP= in CNI_ARGS (Podman's and nerdctl's --ip).
func TestLibcniRequestedAddress(t *testing.T) {
	t.Parallel()
	h := newCNIHost(t, true)
	conflistHasIPs(t, h.list)
	// containerd's CRI arguments, in its order, then Podman's.
	criArgs := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", "web-0"},
		{"K8S_POD_INFRA_CONTAINER_ID", "cid-ips"}, {"K8S_POD_UID", "5e1f"}}
	podmanArgs := func(ip string) [][2]string {
		return [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAME", "happy_turing"}, {"IP", ip}}
	}
	tests := []struct {
		name string
		cid  string
		ips  []string // the ips capability
		args [][2]string
		want string // the address given, or
		code uint   // the CNI error code, and
		msg  string // what its message says
	}{
		{name: "ips capability", cid: "cid-ips", ips: []string{"10.1.0.77/25"}, args: criArgs, want: "10.1.0.77/25"},
		{name: "ips capability without prefix", cid: "cid-ips2", ips: []string{"10.1.0.79"}, args: criArgs, want: "10.1.0.79/25"},
		{name: "IP= of CNI_ARGS", cid: "cid-podman", args: podmanArgs("10.1.0.78"), want: "10.1.0.78/25"},
		{name: "taken: by whom", cid: "cid-taken", ips: []string{"10.1.0.77"}, args: podmanArgs("10.1.0.77"), code: ErrAddressTaken, msg: "pod shop/web-0"},
		{name: "gateway", cid: "cid-gw", ips: []string{"10.1.0.1/25"}, code: ErrBridgeAddress, msg: "gateway"},
		{name: "broadcast", cid: "cid-bc", args: podmanArgs("10.1.0.127"), code: ErrBridgeAddress, msg: "broadcast"},
		{name: "not this host's", cid: "cid-far", ips: []string{"10.1.5.5/24"}, code: ErrAddressNotHere, msg: "not this host's"},
		{name: "outside the overlay", cid: "cid-out", args: podmanArgs("192.0.2.7"), code: ErrAddressNotHere, msg: "outside overlay"},
		{name: "two sources disagree", cid: "cid-two", ips: []string{"10.1.0.90"}, args: podmanArgs("10.1.0.91"), code: types.ErrInvalidNetworkConfig, msg: "one address per family"},
		{name: "bad CNI_ARGS", cid: "cid-bad", args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAME", "a\x01b"}}, code: types.ErrInvalidEnvironmentVariables, msg: "K8S_POD_NAME"},
		{name: "bad IP=", cid: "cid-badip", args: podmanArgs("10.1.0"), code: types.ErrInvalidEnvironmentVariables, msg: "IP=10.1.0"},
	}
	for _, tt := range tests {
		// Sequential: "taken" needs the first case's address.
		c := h.container(t, strings.TrimPrefix(tt.cid, "cid-"))
		rt := runtimeConf(tt.cid, c)
		rt.Args = tt.args
		if tt.ips != nil {
			rt.CapabilityArgs = map[string]any{"ips": tt.ips}
		}
		t.Run(tt.name, func(t *testing.T) {
			res, err := h.add(rt)
			if tt.code != 0 {
				var te *types.Error
				if !errors.As(err, &te) || te.Code != tt.code || !strings.Contains(te.Msg, tt.msg) {
					t.Fatalf("ADD: %v (%T), want code %d saying %q", err, err, tt.code, tt.msg)
				}
				if err := h.del(rt); err != nil {
					t.Errorf("DEL after a refused ADD: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if len(res.IPs) != 1 || res.IPs[0].Address.String() != tt.want {
				t.Fatalf("ADD result IPs = %v, want %s", res.IPs, tt.want)
			}
			if got, _, _ := containerAddr(t, c); got.String() != tt.want {
				t.Errorf("eth0 in the container has %s, want %s", got, tt.want)
			}
			if err := h.check(rt); err != nil {
				t.Errorf("CHECK: %v", err)
			}
		})
	}
	// The owners are recorded as the runtimes gave them.
	list, err := api.NewIPAMClient(h.agent.Sock, DefaultTimeout).List(bounded(t), "ov")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]*api.Owner{}
	for _, a := range list.Allocations {
		owners[a.ContainerID] = a.Owner
	}
	for cid, want := range map[string]api.Owner{
		"cid-ips": {Runtime: api.RuntimeCNI, ContainerID: "cid-ips", IfName: "eth0", PodNamespace: "shop", PodName: "web-0",
			PodUID: "5e1f", PodInfraContainerID: "cid-ips"},
		"cid-podman": {Runtime: api.RuntimeCNI, ContainerID: "cid-podman", IfName: "eth0", PodName: "happy_turing"},
	} {
		got := owners[cid]
		if got == nil || !strings.HasPrefix(got.NetNS, "/run/netns/") {
			t.Errorf("%s: owner %+v, want one with its netns", cid, got)
			continue
		}
		want.NetNS = got.NetNS
		if *got != want {
			t.Errorf("%s: owner %+v, want %+v", cid, *got, want)
		}
	}
}
