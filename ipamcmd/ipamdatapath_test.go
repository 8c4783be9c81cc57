package ipamcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestDataPathsShown (issue 29): carve ipam show groups each agent's peers
// by how its dataplane reaches them, never listing the agent itself, and
// shows the state of the fast path beside its routed peers.
func TestDataPathsShown(t *testing.T) {
	peers := &api.AgentPeers{Self: "h2", FastPath: "on", Peers: []api.AgentPeer{
		{AgentID: "h2", Programmed: true},
		{AgentID: "h4", Programmed: true, Mode: api.DataplaneRouted},
		{AgentID: "h3", Programmed: true, Mode: api.DataplaneRouted},
		{AgentID: "h1", Programmed: true, Mode: api.DataplaneVXLAN},
		{AgentID: "h5", Programmed: true},
		{AgentID: "h6"},
	}}
	var out bytes.Buffer
	if err := printDataPaths(&out, []agentDataPath{dataPathOf("h2", peers), dataPathOf("h7", &api.AgentPeers{Self: "h7"}),
		dataPathOf("h8", &api.AgentPeers{Self: "h8", FastPath: "unavailable: no TCX", Peers: []api.AgentPeer{{AgentID: "h9", Programmed: true, Mode: api.DataplaneRouted}}})}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"data path (each agent's peers, by how it reaches them):",
		"AGENT MODE PEERS",
		"h2 routed (fast path on) h3,h4",
		"h2 unprogrammed h6",
		"h2 vxlan h1",
		"h2 wireguard h5",
		"h7 - -",
		"h8 routed (fast path unavailable: no TCX) h9",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("printed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
