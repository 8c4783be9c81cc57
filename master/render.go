package master

import (
	"net/netip"

	"github.com/carve-net/carve/api"
)

// renderAgent turns a record into its API form under the network
// configuration n (nil while none is committed).
func renderAgent(n *network, rec *agentRecord) *api.AgentInfo {
	info := &api.AgentInfo{
		AgentID:       rec.ID,
		Hostname:      rec.Hostname,
		MeshAddr:      rec.MeshAddr,
		Version:       rec.Version,
		NetworkConfig: rec.Bridges,
	}
	if rec.IP.IsValid() {
		info.IP = rec.IP.String()
	}
	if n == nil {
		return info
	}
	vxlan := &api.VXLANInfo{
		VNI:      n.api.VNI,
		VTEPName: n.api.VTEPName,
		VTEPIP:   netip.PrefixFrom(rec.VTEP, n.vtepNet.Bits()).String(),
		VTEPMAC:  api.VTEPMAC(n.oui, rec.VTEP).String(),
		VTEPPort: n.api.VTEPPort,
		VTEPMTU:  n.api.VTEPMTU,
	}
	for _, def := range n.overlays {
		l, ok := rec.Leases[def.api.Name]
		if !ok {
			continue
		}
		info.Overlays = append(info.Overlays, renderOverlay(def, l, rec.Bridges, vxlan))
	}
	return info
}

// renderOverlay is one overlay of an agent's record in its API form.
func renderOverlay(def overlayDef, l overlayLease, bridges api.AgentNetworkConfig, vxlan *api.VXLANInfo) api.AgentOverlay {
	ov := api.AgentOverlay{Info: def.api, Backend: &api.BackendInfo{VXLAN: vxlan}}
	ov.Info.Enabled = nil
	if !def.enabled {
		ov.Info.Enabled = new(bool)
	}
	if l.Subnet.IsValid() {
		ov.Subnet = l.Subnet.String()
	}
	if l.Subnet6.IsValid() {
		ov.Subnet6 = l.Subnet6.String()
	}
	if bridges.MesosBridge || bridges.DockerBridge {
		m, d := &api.BridgeInfo{Name: "m-" + def.api.Name}, &api.BridgeInfo{Name: "d-" + def.api.Name}
		if l.Subnet.IsValid() {
			a, b := halves(l.Subnet)
			m.IP, d.IP = a.String(), b.String()
		}
		if l.Subnet6.IsValid() {
			a, b := halves(l.Subnet6)
			m.IP6, d.IP6 = a.String(), b.String()
		}
		if bridges.MesosBridge && (m.IP != "" || m.IP6 != "") {
			ov.MesosBridge = m
		}
		if bridges.DockerBridge && (d.IP != "" || d.IP6 != "") {
			ov.DockerBridge = d
		}
	}
	for _, b := range l.Blocks {
		ov.Blocks = append(ov.Blocks, b.api())
	}
	switch {
	case !def.enabled:
		ov.State = api.OverlayState{Status: api.StatusDisabled}
	case l.Failed != "" && len(l.Blocks) == 0:
		ov.State = api.OverlayState{Status: api.StatusFailed, Error: l.Failed}
		ov.Backend = nil
	default:
		ov.State = api.OverlayState{Status: api.StatusOK, Error: l.Failed}
	}
	return ov
}
