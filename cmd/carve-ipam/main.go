// Command carve-ipam is the CNI IPAM plugin of carve: a CNI runtime runs it
// (through the bridge plugin) and it asks the local carve agent for the
// container's addresses over the agent's unix socket.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/carve-net/carve/cni"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	p := &cni.Plugin{}
	skel.PluginMainFuncs(p.Funcs(), cni.Versions, "carve-ipam "+version+": carve's CNI IPAM plugin (asks the local carve agent)")
}
