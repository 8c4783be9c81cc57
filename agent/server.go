package agent

import (
	"net/http"
	"net/netip"
	"slices"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/loglevel"
	"github.com/carve-net/carve/vxlan"
)

func (a *Agent) routes() http.Handler {
	r := httpapi.NewRouter()
	r.HandleFunc("/overlay-agent/overlay", a.handleOverlay).Methods(http.MethodGet)
	r.HandleFunc("/overlay-agent/overlays", a.handleOverlay).Methods(http.MethodGet)
	r.HandleFunc("/overlay-agent/peers", a.handlePeers).Methods(http.MethodGet)
	a.ipamRoutes(r)
	a.wireGuardRoutes(r)
	r.HandleFunc("/overlay-agent/docker", func(w http.ResponseWriter, _ *http.Request) {
		if a.docker == nil {
			httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, "the Docker plugin is off (--docker-bridge=false or no --docker-plugin-socket)")
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, a.docker.Status())
	}).Methods(http.MethodGet)
	r.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "agent_id": a.id})
	}).Methods(http.MethodGet)
	r.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{})).Methods(http.MethodGet)
	if a.cfg.LogLevel != nil {
		r.HandleFunc(loglevel.Path, loglevel.Handler(a.cfg.LogLevel, a.cfg.Logger)).Methods(http.MethodGet, http.MethodPut)
	}
	if a.sec.server == nil {
		return r // --insecure without TLS files: plain http, open
	}
	return a.requireClientCert(r)
}

func (a *Agent) handleOverlay(w http.ResponseWriter, _ *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, a.Overlay())
}

// overlayError names the last reconcile's failure that concerns this
// overlay: its VTEP, its bridges or their addresses. Failures of single peer
// entries show in /overlay-agent/peers instead.
func (a *Agent) overlayError(ov *api.AgentOverlay) string {
	if a.lastErr == nil {
		return ""
	}
	if a.lastReport == nil { // the desired state itself could not be computed
		return a.lastErr.Error()
	}
	var names []string
	for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
		if br != nil {
			names = append(names, br.Name)
		}
	}
	for _, e := range a.lastReport.Errors {
		switch e.Kind {
		case vxlan.KindVTEP, vxlan.KindSysctl:
			return e.Error()
		case vxlan.KindBridge:
			// By exact name: the bridges of "dcos" are not those of "dcos6".
			if e.Key == "*" || slices.Contains(names, e.Key) {
				return e.Error()
			}
		case vxlan.KindAddress:
			if addressOf(ov, e.Key) {
				return e.Error()
			}
		}
	}
	return ""
}

// addressOf tells whether an address (in CIDR form, as the dataplane names
// it in its errors) is one of the overlay's: its VTEP's, or a gateway
// inside one of its bridges' sub-subnets.
func addressOf(ov *api.AgentOverlay, key string) bool {
	p, err := netip.ParsePrefix(key)
	if err != nil {
		return false
	}
	var mine []string
	if ov.Backend != nil && ov.Backend.VXLAN != nil {
		mine = append(mine, ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPIP6)
	}
	for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
		if br != nil {
			mine = append(mine, br.IP, br.IP6)
		}
	}
	for _, s := range mine {
		if q, err := netip.ParsePrefix(s); err == nil && q.Masked().Contains(p.Addr()) && q.Bits() == p.Bits() {
			return true
		}
	}
	return false
}

func (a *Agent) handlePeers(w http.ResponseWriter, _ *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, a.Peers())
}

// Peers is the agent's membership view with what is programmed.
func (a *Agent) Peers() *api.AgentPeers {
	st := a.members.State()
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := &api.AgentPeers{Self: a.id, MasterIndex: a.masterIndex, ClusterID: a.clusterID, MastersReachable: a.mastersReachable,
		Peers: []api.AgentPeer{}, Tombstones: st.Tombstones}
	for _, p := range st.Records {
		if p.ID == a.id {
			continue
		}
		v, ok := a.programmed[p.ID]
		vtepIP, vtepMAC := p.VTEP()
		out.Peers = append(out.Peers, api.AgentPeer{AgentID: p.ID, IP: p.IP, VTEPIP: vtepIP, VTEPMAC: vtepMAC,
			Subnets: p.Subnets(), Version: p.Version, Programmed: ok && v >= p.Version, Mode: a.peerModeLocked(p.ID)})
	}
	return out
}
