package ipamcmd

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/carve-net/carve/api"
)

// agentDataPath is how one agent's dataplane reaches its peers, as it
// reports (GET /overlay-agent/peers): the peer ids by mode (vxlan, routed,
// wireguard for a programmed peer without a mode, unprogrammed).
type agentDataPath struct {
	AgentID string              `json:"agent_id"`
	Peers   map[string][]string `json:"peers"`
	// FastPath is the state of the eBPF fast path of its routed peers
	// (api.AgentPeers.FastPath), shown beside them.
	FastPath string `json:"fast_path,omitempty"`
}

// dataPathOf groups an agent's peers by how it reaches them.
func dataPathOf(id string, peers *api.AgentPeers) agentDataPath {
	dp := agentDataPath{AgentID: id, Peers: map[string][]string{}, FastPath: peers.FastPath}
	for _, p := range peers.Peers {
		if p.AgentID == peers.Self {
			continue
		}
		mode := p.Mode
		switch {
		case !p.Programmed:
			mode = "unprogrammed"
		case mode == "":
			mode = "wireguard"
		}
		dp.Peers[mode] = append(dp.Peers[mode], p.AgentID)
	}
	for _, ids := range dp.Peers {
		slices.Sort(ids)
	}
	return dp
}

// printDataPaths prints, per agent read, its peers by mode.
func printDataPaths(out io.Writer, paths []agentDataPath) error {
	if len(paths) == 0 {
		return nil
	}
	fmt.Fprintln(out, "data path (each agent's peers, by how it reaches them):")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AGENT\tMODE\tPEERS")
	for _, dp := range paths {
		if len(dp.Peers) == 0 {
			fmt.Fprintf(tw, "  %s\t-\t-\n", dp.AgentID)
		}
		for _, mode := range slices.Sorted(maps.Keys(dp.Peers)) {
			shown := mode
			if mode == api.DataplaneRouted && dp.FastPath != "" {
				shown += " (fast path " + dp.FastPath + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", dp.AgentID, shown, strings.Join(dp.Peers[mode], ","))
		}
	}
	return tw.Flush()
}
