package ipam

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/api"
)

// podOwner is an owner as containerd's CRI names it.
func podOwner(cid, netns string) *api.Owner {
	return &api.Owner{Runtime: api.RuntimeCNI, ContainerID: cid, IfName: "eth0", NetNS: netns,
		PodNamespace: "shop", PodName: "web-" + cid, PodUID: "uid-" + cid}
}

func TestRequestedAddresses(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
	ctx := context.Background()
	if _, err := h.client.Allocate(ctx, api.IPAMRequest{Network: "carve", ContainerID: "holder", IfName: "eth0",
		Addresses: []string{"10.128.2.40"}, Owner: podOwner("holder", "/run/netns/cni-1")}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		addresses []string
		family    string
		bridge    string
		want      string // the address given, or
		code      string // the error's code, and
		msg       []string
	}{
		{name: "free address of the bridge", addresses: []string{"10.128.2.77"}, family: "4", want: "10.128.2.77/24"},
		{name: "with a prefix length", addresses: []string{"10.128.2.78/24"}, family: "4", want: "10.128.2.78/24"},
		{name: "both families", addresses: []string{"10.128.2.79", "fd00:0:0:1::79"}, want: "10.128.2.79/24,fd00:0:0:1::79/65"},
		{name: "docker bridge", addresses: []string{"10.128.3.9"}, bridge: api.BridgeDocker, want: "10.128.3.9/24"},
		{name: "taken, by whom", addresses: []string{"10.128.2.40"}, family: "4", code: api.CodeTaken, msg: []string{"pod shop/web-holder", "carve ipam show --ip 10.128.2.40"}},
		{name: "another agent's space", addresses: []string{"10.128.4.5"}, family: "4", code: api.CodeNotOwned, msg: []string{"agent other holds it"}},
		{name: "outside the overlay", addresses: []string{"10.200.0.1"}, family: "4", code: api.CodeNotOwned, msg: []string{"outside overlay", "10.128.0.0/16"}},
		{name: "this agent's, other bridge", addresses: []string{"10.128.3.9"}, family: "4", code: api.CodeNotOwned, msg: []string{"another bridge's range"}},
		{name: "gateway", addresses: []string{"10.128.2.1"}, family: "4", code: api.CodeBridgeAddress,
			msg: []string{"requested address 10.128.2.1 is the gateway of the mesos bridge's block 10.128.2.0/24 (the bridge answers for it): ask for one from 10.128.2.2 to 10.128.2.254, or for none and carve chooses one"}},
		{name: "network address", addresses: []string{"10.128.2.0"}, family: "4", code: api.CodeBridgeAddress,
			msg: []string{"requested address 10.128.2.0 is the network address of the mesos bridge's block 10.128.2.0/24", "from 10.128.2.2 to 10.128.2.254"}},
		{name: "broadcast", addresses: []string{"10.128.2.255"}, family: "4", code: api.CodeBridgeAddress,
			msg: []string{"requested address 10.128.2.255 is the broadcast address of the mesos bridge's block 10.128.2.0/24", "from 10.128.2.2 to 10.128.2.254"}},
		{name: "IPv6 gateway", addresses: []string{"fd00:0:0:1::1"}, family: "6", code: api.CodeBridgeAddress,
			msg: []string{"requested address fd00:0:0:1::1 is the gateway of the mesos bridge's block fd00:0:0:1::/65", "ask for one from fd00:0:0:1::2 to fd00::1:7fff:ffff:ffff:ffff"}},
		{name: "two of a family", addresses: []string{"10.128.2.80", "10.128.2.81"}, code: api.CodeBadRequest, msg: []string{"one address per family"}},
		{name: "family excluded", addresses: []string{"fd00:0:0:1::80"}, family: "4", code: api.CodeBadRequest, msg: []string{"no IPv6 range"}},
		{name: "not an address", addresses: []string{"10.128.2"}, code: api.CodeBadRequest},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := api.IPAMRequest{Network: "carve", ContainerID: "c" + string(rune('a'+i)), IfName: "eth0", Bridge: tt.bridge,
				Addresses: tt.addresses, Family: tt.family}
			a, err := h.client.Allocate(ctx, req)
			if tt.code != "" {
				if !api.IsCode(err, tt.code) {
					t.Fatalf("err %v, want code %s", err, tt.code)
				}
				for _, m := range tt.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("err %q does not say %q", err, m)
					}
				}
				// Nothing stays taken after a refusal.
				if _, err := h.client.Lookup(ctx, req); !api.IsCode(err, api.CodeNotFound) {
					t.Errorf("after a refused request: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ip := range a.IPs {
				got = append(got, ip.Address)
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("got %v, want %s", got, tt.want)
			}
			// A retried ADD with the same request is the same answer; with
			// another address it is a conflict.
			if _, err := h.client.Allocate(ctx, req); err != nil {
				t.Errorf("retry: %v", err)
			}
			req.Addresses = []string{"10.128.2.99"}
			if req.Bridge == api.BridgeDocker {
				req.Addresses = []string{"10.128.3.99"}
			}
			if _, err := h.client.Allocate(ctx, req); !api.IsCode(err, api.CodeConflict) {
				t.Errorf("retry with another address: %v, want conflict", err)
			}
		})
	}
}

func TestOwnerPersisted(t *testing.T) {
	dir := t.TempDir()
	// A record of an agent from before owners: written straight to the
	// store, as that agent did.
	db := openDB(t, dir)
	if _, err := load(db); err != nil { // the buckets
		t.Fatal(err)
	}
	old, _ := json.Marshal(map[string]string{"bridge": "mesos", "v4": "10.128.2.50"})
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(ipamstore.AllocBucket)).Put([]byte("carve\x00old\x00eth0"), old)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	h := newHarness(t, dir, harnessOptions{})
	owner := &api.Owner{Runtime: api.RuntimeCNI, ContainerID: "nomad1", IfName: "eth0", NetNS: "/var/run/netns/abc",
		NomadAllocID: "8c2b", NomadJobID: "api", NomadGroup: "web", NomadNamespace: "default"}
	if _, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "nomad1", IfName: "eth0", Owner: owner}); err != nil {
		t.Fatal(err)
	}
	h.close()
	h = newHarness(t, dir, harnessOptions{})
	list, err := h.client.List(context.Background(), "carve")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*api.Owner{}
	for _, a := range list.Allocations {
		got[a.ContainerID] = a.Owner
	}
	tests := []struct {
		name string
		cid  string
		want *api.Owner
	}{
		{"an owner survives a restart", "nomad1", owner},
		{"an old record loads without one", "old", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, ok := got[tt.cid]
			if !ok {
				t.Fatalf("%s not listed after the restart: %+v", tt.cid, list.Allocations)
			}
			if (o == nil) != (tt.want == nil) || (o != nil && *o != *tt.want) {
				t.Errorf("owner %+v, want %+v", o, tt.want)
			}
		})
	}
	if s := got["nomad1"].String(); !strings.Contains(s, "nomad alloc 8c2b (job api, group web)") {
		t.Errorf("owner as text: %q", s)
	}
}

func TestOwnerValidated(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
	tests := []struct {
		name  string
		owner api.Owner
		field string
	}{
		{"control character", api.Owner{PodName: "web\x00"}, "owner.k8s_pod_name"},
		{"too long", api.Owner{NomadJobID: strings.Repeat("j", 300)}, "owner.nomad_job_id"},
		{"relative netns", api.Owner{NetNS: "run/netns/x"}, "owner.netns"},
		{"newline", api.Owner{ContainerName: "a\nb"}, "owner.container_name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "v", IfName: "eth0", Owner: &tt.owner})
			if !api.IsCode(err, api.CodeBadRequest) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("err %v, want bad_request naming %s", err, tt.field)
			}
		})
	}
}

func TestCapacityMetrics(t *testing.T) {
	// No growth in the background: the test says when growth failed.
	h := newHarness(t, t.TempDir(), harnessOptions{growth: GrowthConfig{LowWater: -1}})
	for i := range 3 {
		h.alloc("m"+string(rune('a'+i)), "eth0", "")
	}
	h.alloc("d", "eth0", api.BridgeDocker)
	// Both /24 bridges: 253 hosts each; the IPv6 /65 of the mesos bridge.
	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"IPv4 used", "carve_agent_ipam_addresses", map[string]string{"overlay": "carve", "family": "4", "state": "used"}, 4},
		{"IPv4 free", "carve_agent_ipam_addresses", map[string]string{"overlay": "carve", "family": "4", "state": "free"}, 2*253 - 4},
		{"IPv6 used", "carve_agent_ipam_addresses", map[string]string{"overlay": "carve", "family": "6", "state": "used"}, 3},
		{"free ratio", "carve_agent_ipam_free_ratio", map[string]string{"overlay": "carve"}, float64(2*253-4) / (2 * 253)},
		{"not full", "carve_agent_ipam_overlay_full", map[string]string{"overlay": "carve"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := h.gauge(tt.metric, tt.labels)
			if !ok || got != tt.want {
				t.Errorf("%s%v = %v (present %v), want %v", tt.metric, tt.labels, got, ok, tt.want)
			}
		})
	}
	// Full: the free fraction is under capacity.LowFreeRatio and the last growth
	// found no space. Fill the docker bridge and most of the mesos one.
	for i := range 252 {
		h.alloc("dd"+strconv.Itoa(i), "eth0", api.BridgeDocker)
	}
	for i := range 230 {
		h.alloc("mm"+strconv.Itoa(i), "eth0", "")
	}
	if got, _ := h.gauge("carve_agent_ipam_overlay_full", map[string]string{"overlay": "carve"}); got != 0 {
		t.Errorf("full before any growth failed: %v", got)
	}
	h.svc.capacity.NoteGrowth("carve", false, true, time.Now()) // a growth found no space
	if got, _ := h.gauge("carve_agent_ipam_overlay_full", map[string]string{"overlay": "carve"}); got != 1 {
		t.Errorf("full after a growth found no space: %v", got)
	}
}
