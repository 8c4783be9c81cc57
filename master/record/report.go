package record

import (
	"fmt"

	"github.com/carve-net/carve/api"
)

// Report is an agent's last configuration report (api.ReportRequest),
// in the replicated state (snapshots and the state digest encode it).
type Report struct {
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

// Equal tells whether two reports are the same.
func (r Report) Equal(o Report) bool {
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

// ApplyReport sets each overlay's status from the agent's report when the
// report covers the record's current version; STATUS_CONFIGURING stays
// otherwise (the agent has not configured this version of its leases yet).
func ApplyReport(info *api.AgentInfo, rep Report, version uint64) {
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

// ReportOf is the report a request carries, validated; the error names
// the bad field.
func ReportOf(req api.ReportRequest) (Report, error) {
	rep := Report{Version: req.Version, Attempts: req.ConfigurationAttempts, Overlays: map[string]api.OverlayState{},
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
