package agent

// Rotating the WireGuard key: on request (POST /overlay-agent/wireguard/rotate,
// `carve agent rotate-wireguard-key`) and on --wireguard-key-rotation's
// schedule.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/wireguard"
)

// ErrWireGuardDisabled is returned by RotateWireGuardKey on an agent run
// with --wireguard=false.
var ErrWireGuardDisabled = errors.New("this agent runs with --wireguard=false: it has no WireGuard key")

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
	case errors.Is(err, ErrWireGuardDisabled):
		httpapi.WriteError(w, http.StatusConflict, api.CodeConflict, err.Error())
	case err != nil:
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
	default:
		httpapi.WriteJSON(w, http.StatusOK, st)
	}
}

// RotateWireGuardKey makes a new key pair and registers its public key;
// it returns once the masters signed it into this agent's record. The
// device takes the new key as the signed record arrives, when the peers
// get it too; until then the old key carries the traffic. If no master
// answers in time, the new key stays pending: every later registration
// sends it, and the old key serves until the masters signed the new one.
func (a *Agent) RotateWireGuardKey(ctx context.Context) (*api.WireGuardStatus, error) {
	w := a.wg
	if w.cfg.Disabled {
		return nil, ErrWireGuardDisabled
	}
	w.rotateMu.Lock()
	defer w.rotateMu.Unlock()
	next, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return nil, fmt.Errorf("make a key: %w", err)
	}
	// On disk before the masters hear of it: a signed public key whose
	// private half was lost would cut this host off.
	if err := wireguard.WritePendingKey(w.keyPath, next); err != nil {
		return nil, err
	}
	w.addPending(next)
	rctx, cancel := context.WithTimeout(ctx, rotateTimeout)
	defer cancel()
	a.register(rctx)
	a.mu.RLock()
	signed := a.self != nil && a.self.Keys.WireGuard == next.PublicKey().String()
	a.mu.RUnlock()
	if !signed {
		return nil, fmt.Errorf("the masters did not sign the new key within %s; it stays pending and goes with the next registration", rotateTimeout)
	}
	a.log.Info("wireguard key registered", "public_key", next.PublicKey().String())
	return a.WireGuardStatus(), nil
}

// rotateLoop rotates the key every WireGuard.RotateEvery (when set).
func (a *Agent) rotateLoop(ctx context.Context) {
	every := a.cfg.WireGuard.RotateEvery
	if every <= 0 || a.cfg.WireGuard.Disabled {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := a.RotateWireGuardKey(ctx); err != nil {
				a.log.Warn("scheduled wireguard key rotation", "err", err)
			}
		}
	}
}
