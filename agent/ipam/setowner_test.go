package ipam

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestSetOwner: the owner a runtime learns after allocating (Docker's
// container, from its engine) replaces the recorded one, survives a
// restart, and names the holder in a taken error; a bad owner or an
// attachment the agent does not hold is refused and changes nothing.
func TestSetOwner(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, harnessOptions{})
	a := h.alloc("docker-0242ac110002", "eth0", api.BridgeDocker)
	owner := &api.Owner{Runtime: api.RuntimeDocker, ContainerID: "4f1c9e0d2b7a63c8", ContainerName: "web", EndpointID: "e1", MAC: "02:42:ac:11:00:02"}
	for _, tt := range []struct {
		name         string
		network, cid string
		owner        *api.Owner
		code         string
	}{
		{name: "not held", network: "carve", cid: "nobody", owner: owner, code: api.CodeNotFound},
		{name: "unknown network", network: "red", cid: "docker-0242ac110002", owner: owner, code: api.CodeNotFound},
		{name: "bad owner", network: "carve", cid: "docker-0242ac110002", owner: &api.Owner{ContainerName: "a\x1bb"}, code: api.CodeBadRequest},
		{name: "recorded", network: "carve", cid: "docker-0242ac110002", owner: owner},
		{name: "again: no change", network: "carve", cid: "docker-0242ac110002", owner: owner},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := h.svc.SetOwner(tt.network, tt.cid, "eth0", tt.owner)
			if tt.code == "" && err != nil || tt.code != "" && !api.IsCode(err, tt.code) {
				t.Fatalf("err %v, want code %q", err, tt.code)
			}
		})
	}
	h.close()
	h2 := newHarness(t, dir, harnessOptions{})
	list := h2.svc.List("carve").Allocations
	if len(list) != 1 || list[0].Owner == nil || *list[0].Owner != *owner || addrs(&list[0]) != addrs(a) {
		t.Fatalf("after a restart: %+v, want %s owned by %+v", list, addrs(a), owner)
	}
	_, err := h2.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "other", IfName: "eth0", Bridge: api.BridgeDocker, Address: strings.Split(list[0].IPs[0].Address, "/")[0]})
	if !api.IsCode(err, api.CodeTaken) || !strings.Contains(err.Error(), "docker container web") {
		t.Errorf("a request for its address: %v, want taken naming docker container web", err)
	}
}
