// Package ipamview is what an agent tells operators of its addresses on
// its HTTP API (GET /overlay-agent/ipam/status and /allocations, read by
// carve ipam show and carve ipam check, over the network with a
// certificate of the cluster CA; the IPAM's unix socket is local): the use
// of each overlay's bridges (addresses used and free, blocks), and every
// allocation with what the host says of its container: whether a CNI
// runtime still holds it (libcni's cache of ADD results, its network
// namespace), and whether its host veth is still on the overlay's bridge.
// It reads; it changes nothing.
package ipamview

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
)

// IPAM is what the view reads of the agent's address service (package
// ipam's Service).
type IPAM interface {
	// List is the allocations of a network ("": every one), Unclaimed the
	// records of the IPAM's store it could not claim back.
	List(network string) *api.Allocations
	Unclaimed(network string) []api.Allocation
	// Status is a network's readiness, free counts and blocks, and
	// BridgeSubnets the subnets a bridge of it serves.
	Status(network string) *api.IPAMStatus
	BridgeSubnets(network, bridge string) (v4, v6 netip.Prefix, ok bool)
}

// Links tells which bridge a host interface is on (vxlan.Dataplane).
type Links interface {
	LinkMaster(name string) (master string, exists bool, err error)
}

// View is one agent's IPAM as operators see it.
type View struct {
	AgentID string
	IPAM    IPAM
	// Overlays are the names of the overlays of the agent's record.
	Overlays func() []string
	// CNICacheDir is libcni's cache directory ("": CNI attachments are
	// not checked).
	CNICacheDir string
	// Links reads the host veths' bridges (nil: not checked).
	Links Links
}

// Routes serves the view read-only on the agent's HTTP API.
func (v *View) Routes(r *mux.Router) {
	r.HandleFunc("/overlay-agent/ipam/status", v.handleStatus).Methods(http.MethodGet)
	r.HandleFunc("/overlay-agent/ipam/allocations", v.handleAllocations).Methods(http.MethodGet)
}

// networkParam returns ?network= ("" for every overlay) and false after
// answering 400 for a bad name or another parameter.
func networkParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	q := r.URL.Query()
	for k := range q {
		if k != "network" {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("unknown query parameter %q (want network)", k))
			return "", false
		}
	}
	network := q.Get("network")
	if network != "" {
		if err := api.ValidateOverlayName(network); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "network: "+err.Error())
			return "", false
		}
	}
	return network, true
}

func (v *View) handleStatus(w http.ResponseWriter, r *http.Request) {
	network, ok := networkParam(w, r)
	if !ok {
		return
	}
	st := v.Usage(network)
	if network != "" && len(st.Networks) == 0 {
		httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("this agent has no lease and no allocation on overlay %q", network))
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, st)
}

func (v *View) handleAllocations(w http.ResponseWriter, r *http.Request) {
	network, ok := networkParam(w, r)
	if !ok {
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, v.Allocations(network))
}

// Usage is the agent's address use per overlay (one overlay, or every one
// when network is empty): the overlays of its record and those it still
// holds allocations on.
func (v *View) Usage(network string) *api.AgentIPAMStatus {
	out := &api.AgentIPAMStatus{AgentID: v.AgentID, Networks: []api.IPAMNetworkUsage{}}
	allocs := v.IPAM.List(network).Allocations
	names := v.Overlays()
	for _, al := range allocs {
		names = append(names, al.Network)
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if network != "" && name != network {
			continue
		}
		st := v.IPAM.Status(name)
		u := api.IPAMNetworkUsage{Network: name, Ready: st.Ready, Error: st.Error, Bridges: []api.IPAMBridgeUsage{}}
		for _, kind := range []string{api.BridgeMesos, api.BridgeDocker} {
			b := api.IPAMBridgeUsage{Bridge: kind}
			v4, v6, served := v.IPAM.BridgeSubnets(name, kind)
			if v4.IsValid() {
				b.Subnet = v4.String()
			}
			if v6.IsValid() {
				b.Subnet6 = v6.String()
			}
			held := false
			for _, al := range allocs {
				if al.Network != name || al.Bridge != kind {
					continue
				}
				held = true
				for _, ip := range al.IPs {
					switch p, err := netip.ParsePrefix(ip.Address); {
					case err != nil:
					case p.Addr().Is4():
						b.Used++
					default:
						b.Used6++
					}
				}
			}
			if free, ok := st.Free[kind]; ok {
				b.Free = &free
			}
			b.Blocks, b.Blocks6 = st.Blocks[kind], st.Blocks6[kind]
			if served || held {
				u.Bridges = append(u.Bridges, b)
			}
		}
		out.Networks = append(out.Networks, u)
	}
	return out
}

// Allocations is every allocation of the agent (of one overlay when
// network is set), then the records of its store it could not claim back,
// with what the agent can tell of their containers.
func (v *View) Allocations(network string) *api.AgentAllocations {
	allocs := v.IPAM.List(network).Allocations
	claimed := len(allocs)
	allocs = append(allocs, v.IPAM.Unclaimed(network)...)
	cache, cacheErr := readCNICache(v.CNICacheDir)
	out := &api.AgentAllocations{AgentID: v.AgentID, Allocations: make([]api.AgentAllocation, 0, len(allocs))}
	for i, al := range allocs {
		aa := api.AgentAllocation{Allocation: al, Container: api.ContainerUnknown, Unclaimed: i >= claimed}
		switch {
		case al.Bridge != api.BridgeMesos:
			aa.ContainerDetail = "a " + al.Bridge + " allocation: only CNI attachments are checked"
		case v.CNICacheDir == "":
			aa.ContainerDetail = "the agent runs without --cni-cache-dir"
		case cacheErr != nil:
			aa.ContainerDetail = cacheErr.Error()
		default:
			aa.Container, aa.ContainerDetail = cache.container(al)
			if aa.Container == api.ContainerLive && !aa.Unclaimed {
				aa.Detached = v.detached(al, cache[cniAttachment{al.Network, al.ContainerID, al.IfName}])
			}
		}
		out.Allocations = append(out.Allocations, aa)
	}
	return out
}

// cniAttachment names an attachment as libcni's cache does.
type cniAttachment struct{ network, containerID, ifName string }

// cniCache maps the attachments a CNI runtime holds to what the cache
// says of them.
type cniCache map[cniAttachment]cniEntry

// cniEntry is an attachment of libcni's cache: its network namespace path
// ("" when the cache names none) and the host-side interfaces of its
// result (the bridge and the host veth, for the bridge plugin).
type cniEntry struct {
	netns string
	host  []string
}

// readCNICache reads libcni's cache of ADD results (dir/results/*): libcni
// writes an entry when an ADD succeeds and removes it when the DEL does.
// A missing results directory is an empty cache.
func readCNICache(dir string) (cniCache, error) {
	out := cniCache{}
	if dir == "" {
		return out, nil
	}
	files, err := os.ReadDir(filepath.Join(dir, "results"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return out, nil
		}
		return nil, fmt.Errorf("read the CNI cache: %w", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, "results", f.Name()))
		if err != nil {
			continue // removed by a DEL meanwhile
		}
		var e struct {
			ContainerID string `json:"containerId"`
			IfName      string `json:"ifName"`
			NetworkName string `json:"networkName"`
			NetNS       string `json:"netns"`
			Result      struct {
				Interfaces []struct {
					Name    string `json:"name"`
					Sandbox string `json:"sandbox"`
				} `json:"interfaces"`
			} `json:"result"`
		}
		if json.Unmarshal(data, &e) != nil || e.ContainerID == "" {
			continue
		}
		entry := cniEntry{netns: e.NetNS}
		for _, i := range e.Result.Interfaces {
			if i.Sandbox == "" && i.Name != "" {
				entry.host = append(entry.host, i.Name)
			}
		}
		out[cniAttachment{e.NetworkName, e.ContainerID, e.IfName}] = entry
	}
	return out, nil
}

// detached says why a live CNI container holding al is not on its
// overlay's mesos bridge: its host veth (in the runtime's cache entry) is
// gone, on no bridge or on another; "" when it is on it, or when the cache
// names no host veth or the kernel cannot be read.
func (v *View) detached(al api.Allocation, entry cniEntry) string {
	if v.Links == nil {
		return ""
	}
	bridge := "m-" + al.Network
	for _, name := range entry.host {
		if name == bridge {
			continue
		}
		master, exists, err := v.Links.LinkMaster(name)
		switch {
		case err != nil:
			return ""
		case !exists:
			return fmt.Sprintf("its host veth %s no longer exists", name)
		case master == "":
			return fmt.Sprintf("its host veth %s is on no bridge (%s was removed under it)", name, bridge)
		case master != bridge:
			return fmt.Sprintf("its host veth %s is on %s, not %s", name, master, bridge)
		}
		return ""
	}
	return ""
}

// container tells whether a CNI runtime still holds the allocation.
func (c cniCache) container(al api.Allocation) (state, detail string) {
	entry, ok := c[cniAttachment{al.Network, al.ContainerID, al.IfName}]
	netns := entry.netns
	switch {
	case !ok:
		return api.ContainerGone, "no CNI runtime holds it (no entry in the CNI cache)"
	case netns == "":
		return api.ContainerLive, "in the CNI cache"
	}
	if _, err := os.Stat(netns); errors.Is(err, fs.ErrNotExist) {
		return api.ContainerGone, "its network namespace " + netns + " no longer exists"
	}
	return api.ContainerLive, "in the CNI cache, network namespace " + netns
}
