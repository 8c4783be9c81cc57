package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/carve-net/carve/agent/ipamview"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/internal/loglevel"
)

func (a *Agent) routes() http.Handler {
	r := httpapi.NewRouter()
	r.HandleFunc("/overlay-agent/overlay", a.handleOverlay).Methods(http.MethodGet)
	r.HandleFunc("/overlay-agent/overlays", a.handleOverlay).Methods(http.MethodGet)
	r.HandleFunc("/overlay-agent/peers", a.handlePeers).Methods(http.MethodGet)
	v := &ipamview.View{AgentID: a.id, IPAM: a.ipam, CNICacheDir: a.cfg.CNICacheDir, Overlays: a.overlayNames}
	if a.dp != nil {
		v.Links = a.dp
	}
	v.Routes(r) // the IPAM read-only, for operators
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

// overlayNames are the names of the overlays of the agent's record.
func (a *Agent) overlayNames() []string {
	var names []string
	for _, ov := range a.Overlay().Overlays {
		names = append(names, ov.Info.Name)
	}
	return names
}

func (a *Agent) handleOverlay(w http.ResponseWriter, _ *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, a.Overlay())
}

func (a *Agent) handlePeers(w http.ResponseWriter, _ *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, a.Peers())
}

// Peers is the agent's membership view with what is programmed.
func (a *Agent) Peers() *api.AgentPeers {
	st := a.members.State()
	last := a.kernel.Last()
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := &api.AgentPeers{Self: a.id, MasterIndex: a.masterIndex, ClusterID: a.clusterID, MastersReachable: a.mastersReachable,
		FastPath: last.FastPath(), Peers: []api.AgentPeer{}, Tombstones: st.Tombstones}
	for _, p := range st.Records {
		if p.ID == a.id {
			continue
		}
		v, ok := last.Programmed(p.ID)
		vtepIP, vtepMAC := p.VTEP()
		out.Peers = append(out.Peers, api.AgentPeer{AgentID: p.ID, IP: p.IP, VTEPIP: vtepIP, VTEPMAC: vtepMAC,
			Subnets: p.Subnets(), Version: p.Version, Programmed: ok && v >= p.Version, Mode: last.Mode(p.ID)})
	}
	return out
}
