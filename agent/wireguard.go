package agent

// Encryption between hosts, as the agent serves it: its HTTP routes, the
// key's rotation through the agent's registration, and its status; the
// keys, the plan and the device are package encryption's.

import (
	"context"
	"errors"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/agent/encryption"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

func (a *Agent) wireGuardRoutes(r *mux.Router) {
	r.HandleFunc("/overlay-agent/wireguard", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, a.WireGuardStatus())
	}).Methods(http.MethodGet)
	r.HandleFunc("/overlay-agent/wireguard/rotate", a.handleRotate).Methods(http.MethodPost)
}

// handleRotate rotates the key for an operator (any client of the CA may
// read the agent; only an operator changes its key).
func (a *Agent) handleRotate(w http.ResponseWriter, r *http.Request) {
	if a.sec.server != nil {
		if id, ok := pki.PeerIdentity(r); !ok || id.Role != pki.RoleOperator {
			httpapi.WriteError(w, http.StatusForbidden, api.CodeForbidden,
				"rotating the WireGuard key takes an operator certificate (carve certs issue --role operator --name NAME)")
			return
		}
	}
	st, err := a.RotateWireGuardKey(r.Context())
	switch {
	case errors.Is(err, encryption.ErrDisabled):
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, err.Error())
	case err != nil:
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
	default:
		httpapi.WriteJSON(w, http.StatusOK, st)
	}
}

// RotateWireGuardKey makes a new key pair and registers its public key;
// it returns once the masters signed it into this agent's record (see
// encryption.WireGuard.Rotate), encryption.ErrDisabled on an agent run
// with --wireguard=false.
func (a *Agent) RotateWireGuardKey(ctx context.Context) (*api.WireGuardStatus, error) {
	return a.wg.Rotate(ctx, wgRegistrar{a})
}

// wgRegistrar is the agent's registration as a rotation of its WireGuard
// key uses it.
type wgRegistrar struct{ a *Agent }

// Register registers the agent (its pending WireGuard key among what it
// sends).
func (r wgRegistrar) Register(ctx context.Context) { r.a.register(ctx) }

// RegisteredKey is the WireGuard key of the agent's signed record.
func (r wgRegistrar) RegisteredKey() string { return r.a.registeredWireGuardKey() }

// registeredWireGuardKey is the WireGuard key this agent's signed record
// carries ("" before one).
func (a *Agent) registeredWireGuardKey() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.self == nil {
		return ""
	}
	return a.self.Keys.WireGuard
}

// WireGuardStatus is the agent's encryption as it runs.
func (a *Agent) WireGuardStatus() *api.WireGuardStatus {
	return a.wg.Status(a.registeredWireGuardKey())
}
