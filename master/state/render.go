package state

import (
	"fmt"
	"net/netip"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/prefixspace"
)

// render is rec in its API form, with the agent's last configuration
// report; the caller holds t.mu.
func (t *LeaseTable) render(rec *agentRecord) *api.AgentInfo {
	info := renderAgent(t.net, rec)
	applyReport(info, t.reports[rec.ID], rec.Version)
	return info
}

// renderAgent turns a record into its API form under the network
// configuration n (nil while none is committed). Every overlay shows
// STATUS_CONFIGURING: the status is the agent's report (applyReport).
//
// The form is DC/OS's AgentInfo: ip is always present (api.NoIP while a
// newer registration holds the agent's IP), only leased overlays are
// listed, each with its backend; an overlay that is disabled, or that had
// no subnet left for the agent, is named in not_leased with the reason.
func renderAgent(n *network, rec *agentRecord) *api.AgentInfo {
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
func renderOverlay(def overlayDef, l overlayLease, bridges api.AgentNetworkConfig, vxlan *api.VXLANInfo) api.AgentOverlay {
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
		ov.Blocks = append(ov.Blocks, b.api())
	}
	return ov
}

// agentReport is an agent's last configuration report (ReportRequest), in
// the replicated state.
type agentReport struct {
	// Version is the record version the agent configured.
	Version  uint64                      `json:"version"`
	Overlays map[string]api.OverlayState `json:"overlays,omitempty"`
	Attempts uint32                      `json:"configuration_attempts,omitempty"`
	// SigningKey, Refusing, ProgrammedPeers and PeersIndex are the
	// report's (api.ReportRequest); omitted when absent, so that the
	// states of agents that report none encode (and digest) as before.
	SigningKey      string `json:"signing_key,omitempty"`
	Refusing        string `json:"refusing,omitempty"`
	ProgrammedPeers *int   `json:"programmed_peers,omitempty"`
	PeersIndex      uint64 `json:"peers_index,omitempty"`
	// MeshPassword and MeshAccepted are the report's fingerprints of the
	// agent's mesh passwords (api.MeshPasswordFingerprint), omitted as
	// above.
	MeshPassword string `json:"mesh_password,omitempty"`
	MeshAccepted string `json:"mesh_accepted,omitempty"`
}

func (r agentReport) equal(o agentReport) bool {
	if r.Version != o.Version || r.Attempts != o.Attempts || len(r.Overlays) != len(o.Overlays) ||
		r.SigningKey != o.SigningKey || r.Refusing != o.Refusing || r.PeersIndex != o.PeersIndex ||
		r.MeshPassword != o.MeshPassword || r.MeshAccepted != o.MeshAccepted ||
		(r.ProgrammedPeers == nil) != (o.ProgrammedPeers == nil) || (r.ProgrammedPeers != nil && *r.ProgrammedPeers != *o.ProgrammedPeers) {
		return false
	}
	for k, v := range r.Overlays {
		if w, ok := o.Overlays[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// applyReport sets each overlay's status from the agent's report when the
// report covers the record's current version; STATUS_CONFIGURING stays
// otherwise (the agent has not configured this version of its leases yet).
func applyReport(info *api.AgentInfo, rep agentReport, version uint64) {
	info.ConfigurationAttempts = rep.Attempts
	if rep.Version < version {
		return
	}
	for i := range info.Overlays {
		if st, ok := rep.Overlays[info.Overlays[i].Info.Name]; ok {
			info.Overlays[i].State = st
		}
	}
}

// reportOf is the report a request carries, validated.
func reportOf(req api.ReportRequest) (agentReport, error) {
	rep := agentReport{Version: req.Version, Attempts: req.ConfigurationAttempts, Overlays: map[string]api.OverlayState{},
		SigningKey: req.SigningKey, Refusing: req.Refusing, PeersIndex: req.PeersIndex,
		MeshPassword: req.MeshPassword, MeshAccepted: req.MeshAccepted}
	if req.SigningKey != "" {
		if _, err := api.ParseSigningKey(req.SigningKey); err != nil {
			return rep, fmt.Errorf("signing_key: %w", err)
		}
	}
	for _, f := range []struct{ name, value string }{{"mesh_password", req.MeshPassword}, {"mesh_accepted", req.MeshAccepted}} {
		if f.value != "" && !api.ValidMeshPasswordFingerprint(f.value) {
			return rep, fmt.Errorf("%s: %.40q is no mesh password fingerprint: want 16 lowercase hex digits (api.MeshPasswordFingerprint)", f.name, f.value)
		}
	}
	if req.MeshAccepted != "" && req.MeshPassword == "" {
		return rep, fmt.Errorf("mesh_accepted: set without mesh_password (an agent accepts a second password only besides the one it sends)")
	}
	if len(req.Refusing) > maxReportError {
		return rep, fmt.Errorf("refusing: %d bytes, at most %d", len(req.Refusing), maxReportError)
	}
	if p := req.ProgrammedPeers; p != nil {
		if *p < 0 {
			return rep, fmt.Errorf("programmed_peers: %d, want 0 or more", *p)
		}
		n := *p
		rep.ProgrammedPeers = &n
	}
	if len(req.Overlays) > maxReportOverlays {
		return rep, fmt.Errorf("overlays: %d entries, at most %d", len(req.Overlays), maxReportOverlays)
	}
	for i, o := range req.Overlays {
		if err := api.ValidateOverlayName(o.Name); err != nil {
			return rep, fmt.Errorf("overlays[%d].name: %w", i, err)
		}
		if _, dup := rep.Overlays[o.Name]; dup {
			return rep, fmt.Errorf("overlays[%d].name: %q is reported twice", i, o.Name)
		}
		if !api.ValidReportedStatus(o.Status) {
			return rep, fmt.Errorf("overlays[%d].status %q: want %s, %s or %s", i, o.Status, api.StatusOK, api.StatusFailed, api.StatusConfiguring)
		}
		if len(o.Error) > maxReportError {
			return rep, fmt.Errorf("overlays[%d].error: %d bytes, at most %d", i, len(o.Error), maxReportError)
		}
		if o.Status == api.StatusOK && o.Error != "" {
			return rep, fmt.Errorf("overlays[%d].error: set with %s", i, api.StatusOK)
		}
		rep.Overlays[o.Name] = api.OverlayState{Status: o.Status, Error: o.Error}
	}
	return rep, nil
}

// Bounds of a configuration report.
const (
	maxReportOverlays = 256
	maxReportError    = 1024
)
