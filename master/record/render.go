package record

import (
	"net/netip"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/prefixspace"
)

// Render turns a record into its API form under the network
// configuration n (nil while none is committed): the form the masters
// sign (api.RecordSigningBytes) and serve. Every overlay shows
// STATUS_CONFIGURING: the status is the agent's report (ApplyReport).
//
// The form is DC/OS's AgentInfo: ip is always present (api.NoIP while a
// newer registration holds the agent's IP), only leased overlays are
// listed, each with its backend; an overlay that is disabled, or that had
// no subnet left for the agent, is named in not_leased with the reason.
func Render(n *netconfig.Network, rec *Agent) *api.AgentInfo {
	info := &api.AgentInfo{
		AgentID:       rec.ID,
		Hostname:      rec.Hostname,
		IP:            api.NoIP,
		MeshAddr:      rec.MeshAddr,
		Version:       rec.Version,
		NetworkConfig: rec.Bridges,
		Keys:          rec.Keys,
		UnderlayMTU:   rec.UnderlayMTU,
		CarveVersion:  rec.CarveVersion,
	}
	if rec.IP.IsValid() {
		info.IP = rec.IP.String()
	}
	if n == nil {
		return info
	}
	cfg := n.Config()
	vxlan := &api.VXLANInfo{
		VNI:      cfg.VNI,
		VTEPName: cfg.VTEPName,
		VTEPIP:   netip.PrefixFrom(rec.VTEP, n.VTEPNet().Bits()).String(),
		VTEPMAC:  api.VTEPMAC(n.OUI(), rec.VTEP).String(),
		VTEPPort: cfg.VTEPPort,
		VTEPMTU:  cfg.VTEPMTU,
	}
	if rec.VTEP6.IsValid() && n.VTEPNet6().IsValid() {
		vxlan.VTEPIP6 = netip.PrefixFrom(rec.VTEP6, n.VTEPNet6().Bits()).String()
	}
	for def := range n.Overlays() {
		l, ok := rec.Leases[def.Name()]
		switch {
		case !def.Enabled() && (!ok || !l.Subnet.IsValid() && !l.Subnet6.IsValid()):
			info.NotLeased = append(info.NotLeased, api.NotLeased{Name: def.Name(),
				Reason: "disabled (enabled: false in the network configuration)"})
			continue
		case !ok:
			continue
		case !def.Enabled():
			// Draining: the agent keeps its bridges, routes and conflist
			// while containers are attached, and takes no new one.
			ov := renderOverlay(def, l, rec.Bridges, vxlan)
			ov.Info.Enabled = new(bool)
			info.Overlays = append(info.Overlays, ov)
			continue
		}
		if l.Failed != "" {
			info.NotLeased = append(info.NotLeased, api.NotLeased{Name: def.Name(), Reason: l.Failed})
		}
		if !l.Subnet.IsValid() && !l.Subnet6.IsValid() && len(l.Blocks) == 0 {
			continue
		}
		info.Overlays = append(info.Overlays, renderOverlay(def, l, rec.Bridges, vxlan))
	}
	return info
}

// renderOverlay is one leased overlay of an agent's record in its API form.
func renderOverlay(def netconfig.Overlay, l Lease, bridges api.AgentNetworkConfig, vxlan *api.VXLANInfo) api.AgentOverlay {
	ov := api.AgentOverlay{Info: def.Config(), Backend: &api.BackendInfo{VXLAN: vxlan},
		State: api.OverlayState{Status: api.StatusConfiguring}}
	ov.Info.Enabled = nil // enabled; a draining overlay says "enabled": false
	if l.Subnet.IsValid() {
		ov.Subnet = l.Subnet.String()
	}
	if l.Subnet6.IsValid() {
		ov.Subnet6 = l.Subnet6.String()
	}
	if bridges.MesosBridge || bridges.DockerBridge {
		m, d := &api.BridgeInfo{Name: "m-" + def.Name()}, &api.BridgeInfo{Name: "d-" + def.Name()}
		if l.Subnet.IsValid() {
			a, b := prefixspace.Halves(l.Subnet)
			m.IP, d.IP = a.String(), b.String()
		}
		if l.Subnet6.IsValid() {
			a, b := prefixspace.Halves(l.Subnet6)
			m.IP6, d.IP6 = a.String(), b.String()
		}
		if bridges.MesosBridge {
			ov.MesosBridge = m
		}
		if bridges.DockerBridge {
			ov.DockerBridge = d
		}
	}
	for _, b := range l.Blocks {
		ov.Blocks = append(ov.Blocks, b.API())
	}
	return ov
}
