package ipamcmd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
)

// checkDocker compares, for every agent whose Docker plugin is on, the
// addresses its engine's running containers hold with the allocations
// (held returns the attachments that hold an address): an address two
// running containers hold is a duplicate, one that no allocation of the
// container's agent holds is untracked (carve may hand it out again), and
// an agent whose plugin cannot list its engine is unseen, never clean
// (unless Docker is absent from its host and it holds no docker-bridge
// address: then there is nothing to see).
func checkDocker(snap ipamSnapshot, held func(network, addr string) []holder) []ipamProblem {
	var problems []ipamProblem
	type place struct{ network, addr string }
	running := map[place][]holder{}
	for id, st := range snap.Docker {
		if !st.Engine.Connected && st.Engine.Absent && !holdsDocker(snap.Allocations[id]) {
			continue // no Docker on this host, and no address of a Docker container
		}
		if !st.Engine.Connected || st.ContainersListed.IsZero() {
			why := st.Engine.Error
			if st.Engine.Connected {
				why = st.GC.Error
			}
			if why == "" {
				why = "not listed yet"
			}
			problems = append(problems, ipamProblem{Kind: problemUnseen, Holders: []holder{{AgentID: id}},
				Detail: fmt.Sprintf("its Docker plugin cannot list the engine's running containers (%s): their addresses are not checked", why)})
			continue
		}
		for _, c := range st.Containers {
			addr, err := netip.ParseAddr(c.Address)
			if err != nil {
				continue
			}
			k := place{c.Overlay, addr.Unmap().String()}
			h := holder{AgentID: id, ContainerID: c.ContainerID, DockerName: cli.OrDash(c.Name)}
			if !slices.ContainsFunc(running[k], func(o holder) bool { return o.AgentID == h.AgentID && o.ContainerID == h.ContainerID }) {
				running[k] = append(running[k], h)
			}
			if !slices.ContainsFunc(held(k.network, k.addr), func(o holder) bool { return o.AgentID == id && !o.Unclaimed }) {
				detail := "a running Docker container holds it, but its agent has no allocation of it: carve may hand it out again"
				if why, ok := st.TakeBackWaiting[c.Overlay]; ok {
					detail += fmt.Sprintf(" (the agent waits to take it back: %s)", why)
				} else {
					detail += " (the agent takes it back at its next collection; if this stays, see the agent's log)"
				}
				problems = append(problems, ipamProblem{Kind: problemUntracked, Network: k.network, Address: k.addr, Holders: []holder{h}, Detail: detail})
			}
		}
	}
	for k, hs := range running {
		if len(hs) < 2 {
			continue
		}
		slices.SortFunc(hs, func(a, b holder) int { return strings.Compare(a.String(), b.String()) })
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = h.String()
		}
		problems = append(problems, ipamProblem{Kind: problemDuplicate, Network: k.network, Address: k.addr, Holders: hs,
			Detail: fmt.Sprintf("%d running Docker containers have it: %s; remove all but one of them and run them again (docker rm -f, docker run): each gets a free address", len(hs), strings.Join(names, ", "))})
	}
	return problems
}

// holdsDocker tells whether an agent holds an address on a docker bridge.
func holdsDocker(list *api.AgentAllocations) bool {
	return list != nil && slices.ContainsFunc(list.Allocations, func(a api.AgentAllocation) bool { return a.Bridge == api.BridgeDocker })
}

// shortContainerID is a container id as engines print it (12 characters).
func shortContainerID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
