package ipamcmd

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
)

// TestCheckIPAMDocker: carve ipam check compares the agents' allocations
// with what their Docker engines' running containers hold. Before, it said
// clean whatever Docker had: the duplicate an agent made after losing its
// data dir went unseen, and so did an engine it could not list.
func TestCheckIPAMDocker(t *testing.T) {
	state := &api.State{Index: 7, Agents: []api.AgentInfo{leaseRecord("h1", "10.128.0.1/25", "", "10.128.0.129/25")}}
	id1 := "4f1c9e0d2b7a63c8e5f4a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6"
	id2 := "9a8b7c6d5e4f30211223344556677889900aabbccddeeff00112233445566778"
	listed := func(cs ...dockeripam.ContainerAddress) *dockeripam.Status {
		return &dockeripam.Status{Engine: dockeripam.EngineStatus{Connected: true}, Containers: cs, ContainersListed: time.Unix(1, 0)}
	}
	web := dockeripam.ContainerAddress{Overlay: "carve", Address: "10.128.0.130", ContainerID: id1, Name: "web"}
	db := dockeripam.ContainerAddress{Overlay: "carve", Address: "10.128.0.130", ContainerID: id2, Name: "db"}
	held := []api.AgentAllocation{alloc("docker-ep-1", api.BridgeDocker, api.ContainerUnknown, "10.128.0.130/25")}
	tests := []struct {
		name   string
		allocs []api.AgentAllocation
		docker *dockeripam.Status
		want   []string
	}{
		{name: "every running container's address held", allocs: held, docker: listed(web)},
		{name: "no Docker plugin", allocs: held},
		{
			name: "two running containers with one address (a restart that lost its data dir)", allocs: held, docker: listed(web, db),
			want: []string{"duplicate carve 10.128.0.130 h1/docker container db [9a8b7c6d5e4f],h1/docker container web [4f1c9e0d2b7a]"},
		},
		{
			name: "a running container's address the agent does not hold", docker: listed(web),
			want: []string{"untracked carve 10.128.0.130 h1/docker container web [4f1c9e0d2b7a]"},
		},
		{
			name: "engine unreachable", allocs: held,
			docker: &dockeripam.Status{Engine: dockeripam.EngineStatus{Error: "no Docker engine at unix:///var/run/docker.sock"}},
			want:   []string{"unseen   h1"},
		},
		{
			name: "engine absent, with a Docker container's address", allocs: held,
			docker: &dockeripam.Status{Engine: dockeripam.EngineStatus{Absent: true, Error: "no Docker engine at unix:///var/run/docker.sock"}},
			want:   []string{"unseen   h1"},
		},
		{
			name:   "no Docker on the host, no Docker address",
			docker: &dockeripam.Status{Engine: dockeripam.EngineStatus{Absent: true, Error: "no Docker engine at unix:///var/run/docker.sock"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := ipamSnapshot{State: state, Allocations: map[string]*api.AgentAllocations{"h1": {AgentID: "h1", Allocations: tc.allocs}},
				Docker: map[string]*dockeripam.Status{}}
			if tc.docker != nil {
				snap.Docker["h1"] = tc.docker
			}
			problems := checkIPAM(snap)
			var got []string
			for _, p := range problems {
				var hs []string
				for _, h := range p.Holders {
					hs = append(hs, h.String())
				}
				got = append(got, fmt.Sprintf("%s %s %s %s", p.Kind, p.Network, p.Address, strings.Join(hs, ",")))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s\n(details: %+v)", strings.Join(got, "\n"), strings.Join(tc.want, "\n"), problems)
			}
			rep := &ipamCheckReport{Problems: problems, Clean: len(problems) == 0}
			var buf bytes.Buffer
			if err := printIPAMCheck(&buf, rep); err != nil {
				t.Fatal(err)
			}
			if len(tc.want) > 0 && strings.Contains(buf.String(), "clean") {
				t.Errorf("a report with problems printed clean:\n%s", buf.String())
			}
			if len(tc.want) > 0 && !strings.Contains(buf.String(), tc.want[0][:strings.Index(tc.want[0], " ")]) {
				t.Errorf("the report does not name the problem:\n%s", buf.String())
			}
		})
	}
}
