package encryption

// Rotating the WireGuard key: on request (the agent's POST
// /overlay-agent/wireguard/rotate, `carve agent rotate-wireguard-key`) and
// on --wireguard-key-rotation's schedule.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/wireguard"
)

// ErrDisabled is returned by Rotate on an agent run with
// --wireguard=false.
var ErrDisabled = errors.New("this agent runs with --wireguard=false: it has no WireGuard key")

// Registrar is the agent's registration with the masters, as a rotation
// uses it: the registration sends RegisterKey.
type Registrar interface {
	// Register registers the agent, until it succeeded or ctx ended.
	Register(ctx context.Context)
	// RegisteredKey is the WireGuard public key the agent's signed record
	// carries ("" before one).
	RegisteredKey() string
}

// Rotate makes a new key pair and registers its public key through reg;
// it returns once the masters signed it into this agent's record. The
// device takes the new key as the signed record arrives, when the peers
// get it too; until then the old key carries the traffic. If no master
// answers in time, the new key stays pending: every later registration
// sends it, and the old key serves until the masters signed the new one.
func (w *WireGuard) Rotate(ctx context.Context, reg Registrar) (*api.WireGuardStatus, error) {
	if w.cfg.Disabled {
		return nil, ErrDisabled
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
	reg.Register(rctx)
	registered := reg.RegisteredKey()
	if registered != next.PublicKey().String() {
		return nil, fmt.Errorf("the masters did not sign the new key within %s; it stays pending and goes with the next registration", rotateTimeout)
	}
	w.log.Info("wireguard key registered", "public_key", next.PublicKey().String())
	return w.Status(registered), nil
}

// RotateLoop rotates the key every Config.RotateEvery (when set) until
// ctx ends; its owner runs it in a goroutine it waits for.
func (w *WireGuard) RotateLoop(ctx context.Context, reg Registrar) {
	every := w.cfg.RotateEvery
	if every <= 0 || w.cfg.Disabled {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := w.Rotate(ctx, reg); err != nil {
				w.log.Warn("scheduled wireguard key rotation", "err", err)
			}
		}
	}
}
