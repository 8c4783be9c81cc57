// Package encryption is the agent's side of encryption between hosts: its
// WireGuard key pair and a rotation's pending keys (in their files in the
// data dir), which of its peers go through WireGuard and how the others
// are reached (a Plan), the device brought to the plan (package wireguard
// programs it), the status and metrics, and the key's rotation through the
// agent's registration (rotate.go). See docs/design.md, "Encryption
// between hosts".
package encryption

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
	"github.com/carve-net/carve/wireguard"
)

// DefaultDevice is the name of the agent's WireGuard interface.
const DefaultDevice = "carve-wg"

// KeyFile is the private key's file in the data dir; a rotation's new key
// waits in its own pending file beside it, named by its fingerprint
// (wireguard.PendingKeyPath), until the masters signed it.
const KeyFile = "wireguard.key"

// rotateTimeout bounds the registration of a rotation's new key.
const rotateTimeout = 30 * time.Second

// Config configures the agent's side of encryption between hosts, which
// the network configuration turns on ("encryption").
type Config struct {
	// Disabled makes and registers no key: peers treat this agent as one
	// without a key (cleartext, or dropped in strict mode), and in strict
	// mode it drops what it cannot encrypt.
	Disabled bool
	// Device names the interface (empty: DefaultDevice). With userspace
	// WireGuard its UAPI socket is /var/run/wireguard/NAME.sock, shared by
	// every network namespace on one file system.
	Device string
	// Userspace runs wireguard-go even where the kernel has WireGuard.
	Userspace bool
	// RotateEvery rotates the key on this schedule (0: only on request).
	RotateEvery time.Duration
}

// WireGuard is the agent's WireGuard state: its keys, its device, and what
// it tells of them.
type WireGuard struct {
	cfg      Config
	keyPath  string
	log      *slog.Logger
	peers    *prometheus.GaugeVec
	rotated  prometheus.Counter
	failures prometheus.Counter

	rotateMu sync.Mutex // one rotation at a time

	mu  sync.Mutex
	key wgtypes.Key
	// pending are rotations' keys, oldest first, each in its pending file
	// until a signed record carries it or a newer one: the newest is
	// registered, and any of them may be the one the masters sign (a
	// registration of an older one that arrives late).
	pending []wgtypes.Key
	dev     *wireguard.Device
	// cleaned: a device and routes left by an earlier run with encryption
	// on were removed (once, when this run found encryption off).
	cleaned   bool
	status    api.WireGuardStatus
	rotations int
}

// New loads the key in dataDir (made on the first start) and the
// rotations the masters had not signed when the agent stopped, and
// registers the metrics with reg. With cfg.Disabled it holds no key.
func New(dataDir string, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*WireGuard, error) {
	w := &WireGuard{cfg: cfg, keyPath: filepath.Join(dataDir, KeyFile), log: log.With("component", "wireguard"),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_wireguard_peers",
			Help: "Other agents by how this agent reaches them while encryption is on: keyed (through WireGuard), cleartext (no key in their record: VXLAN in the clear), dropped (no key, strict mode).",
		}, []string{"state"}),
		rotated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_wireguard_key_rotations_total", Help: "WireGuard keys replaced by a newer one that the masters signed.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_wireguard_apply_errors_total", Help: "Failed configurations of the WireGuard device or its routes (retried).",
		}),
	}
	if w.cfg.Device == "" {
		w.cfg.Device = DefaultDevice
	}
	reg.MustRegister(w.peers, w.rotated, w.failures)
	for _, s := range []string{api.PeerKeyed, api.PeerCleartext, api.PeerDropped} {
		w.peers.WithLabelValues(s)
	}
	if w.cfg.Disabled {
		return w, nil
	}
	var err error
	if w.key, err = wireguard.LoadOrCreateKey(w.keyPath); err != nil {
		return nil, err
	}
	// Rotations the masters had not signed when the agent stopped.
	pending, dropped, err := wireguard.LoadPendingKeys(w.keyPath, w.key)
	if err != nil {
		return nil, err
	}
	for _, f := range dropped {
		w.log.Warn("wireguard: a pending key file put right at start (removed: no key, or the current key; or moved to its key's name)", "file", f)
	}
	for i := len(pending) - 1; i >= 0; i-- {
		w.pending = append(w.pending, pending[i].Key)
	}
	return w, nil
}

// Device is the name of the WireGuard interface.
func (w *WireGuard) Device() string { return w.cfg.Device }

// addPending makes key, written to its pending file already, the one to
// register.
func (w *WireGuard) addPending(key wgtypes.Key) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = append(w.pending, key)
}

// RegisterKey is the public key to register: a pending rotation's, else
// the current one ("" with --wireguard=false).
func (w *WireGuard) RegisterKey() string {
	k, ok := w.RegisterKeyPair()
	if !ok {
		return ""
	}
	return k.PublicKey().String()
}

// RegisterKeyPair is the private key whose public half RegisterKey is:
// what proves that this agent holds it (false with --wireguard=false).
func (w *WireGuard) RegisterKeyPair() (wgtypes.Key, bool) {
	if w.cfg.Disabled {
		return wgtypes.Key{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.pending); n > 0 {
		return w.pending[n-1], true
	}
	return w.key, true
}

// Plan is what encryption makes of one reconcile: the device's desired
// state, and the peers by how they are reached.
type Plan struct {
	mode string
	// keyed: this agent's signed record carries a key it holds.
	keyed     bool
	key       wgtypes.Key
	desired   wireguard.Desired
	byState   map[string]int
	cleartext []string
}

// Mode is the network's encryption mode ("" when off).
func (p *Plan) Mode() string { return p.mode }

// Plan takes out of want.Peers the peers reached through WireGuard (with a
// key in their signed record, while this agent's record carries its own)
// and, in strict mode, those without one; it returns the device's desired
// state. With encryption off it changes nothing.
func (w *WireGuard) Plan(self *api.AgentInfo, network *api.NetworkConfig, members membership.State, want *vxlan.Desired) *Plan {
	p := &Plan{byState: map[string]int{}}
	if network == nil || network.Encryption == "" {
		return p
	}
	p.mode = network.Encryption
	strict := p.mode == api.EncryptionWireGuardStrict
	p.key, p.keyed = w.ownKey(self.Keys.WireGuard)
	keys := map[string]wgtypes.Key{}
	for _, r := range members.Records {
		if r.Keys.WireGuard == "" {
			continue
		}
		if k, err := wgtypes.ParseKey(r.Keys.WireGuard); err == nil {
			keys[r.ID] = k
		}
	}
	port := api.WireGuardPortOf(network)
	d := &p.desired
	d.Port = int(port)
	d.MTU = network.OverlayMTU
	d.Source = want.VTEP.Address.Addr()
	if want.VTEP.Address6.IsValid() {
		d.Source6 = want.VTEP.Address6.Addr()
	}
	for _, ov := range network.Overlays {
		for _, s := range []string{ov.Subnet, ov.Subnet6} {
			if pr, err := netip.ParsePrefix(s); err == nil {
				d.Unreachable = append(d.Unreachable, pr)
			}
		}
	}
	vx := want.Peers[:0:0]
	for _, peer := range want.Peers {
		k, ok := keys[peer.ID]
		switch {
		case ok && p.keyed:
			allowed := []netip.Prefix{netip.PrefixFrom(peer.VTEPIP, peer.VTEPIP.BitLen())}
			if peer.VTEPIP6.IsValid() {
				allowed = append(allowed, netip.PrefixFrom(peer.VTEPIP6, 128))
			}
			allowed = append(allowed, peer.Subnets...)
			d.Peers = append(d.Peers, wireguard.Peer{ID: peer.ID, PublicKey: k, Endpoint: netip.AddrPortFrom(peer.UnderlayIP, port), AllowedIPs: allowed})
			p.byState[api.PeerKeyed]++
		case strict:
			p.byState[api.PeerDropped]++
			p.cleartext = append(p.cleartext, peer.ID)
		default:
			vx = append(vx, peer)
			p.byState[api.PeerCleartext]++
			p.cleartext = append(p.cleartext, peer.ID)
		}
	}
	want.Peers = vx
	slices.Sort(p.cleartext)
	return p
}

// ownKey is the private key whose public half is registered: the current
// one, or a rotation's, which becomes current here (written to the key
// file; its pending file and those of older rotations are removed). false
// when the record carries none of them (not registered yet, or
// --wireguard=false): the agent then counts as one without a key.
func (w *WireGuard) ownKey(registered string) (wgtypes.Key, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cfg.Disabled || registered == "" {
		return wgtypes.Key{}, false
	}
	i := slices.IndexFunc(w.pending, func(k wgtypes.Key) bool { return k.PublicKey().String() == registered })
	if i < 0 {
		return w.key, w.key.PublicKey().String() == registered
	}
	next := w.pending[i]
	// The key file gets the key itself, not whatever file is at a name:
	// the signed key is the one installed, whatever rotation came after.
	if err := wireguard.WriteKey(w.keyPath, next); err != nil {
		// Signed, but not in the key file yet: use it now, keep trying
		// (its pending file stays until then).
		w.log.Error("wireguard key rotation: keep the new key", "err", err)
		return next, true
	}
	// Its pending file and older rotations' go: a newer rotation's stays
	// pending, and is registered next.
	for _, k := range w.pending[:i+1] {
		if err := wireguard.RemovePendingKey(w.keyPath, k); err != nil {
			w.log.Warn("wireguard key rotation: could not remove a pending key file", "err", err)
		}
	}
	w.pending = slices.Delete(w.pending, 0, i+1)
	w.key = next
	w.rotations++
	w.rotated.Inc()
	w.log.Info("wireguard key rotated", "public_key", w.key.PublicKey().String())
	return w.key, true
}

// Apply brings the device to the plan: with encryption off it removes
// what an earlier run left. otherNamespace: the agent programs a network
// namespace it does not run in (tests), where encryption is refused and
// nothing of its own namespace is touched.
func (w *WireGuard) Apply(ctx context.Context, p *Plan, otherNamespace bool) error {
	if otherNamespace {
		if p.mode != "" {
			return errors.New("encryption needs the agent to run in the network namespace it programs (Config.NetNS is set)")
		}
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status.Mode, w.status.Peers, w.status.Cleartext = p.mode, p.byState, p.cleartext
	for _, s := range []string{api.PeerKeyed, api.PeerCleartext, api.PeerDropped} {
		w.peers.WithLabelValues(s).Set(float64(p.byState[s]))
	}
	err := w.applyLocked(ctx, p)
	w.status.Error = ""
	if err != nil {
		w.status.Error = err.Error()
		w.failures.Inc()
	}
	return err
}

func (w *WireGuard) applyLocked(ctx context.Context, p *Plan) error {
	if p.mode == "" {
		if w.dev != nil {
			w.dev.Close()
			w.dev = nil
			w.cleaned = false
			w.status.Device, w.status.Implementation = "", ""
		}
		if w.cleaned {
			return nil
		}
		if err := wireguard.Remove(ctx, w.cfg.Device); err != nil {
			return err
		}
		w.cleaned = true
		return nil
	}
	if w.cfg.Disabled {
		if p.mode == api.EncryptionWireGuardStrict {
			w.cleaned = false
			_, err := wireguard.ApplyUnreachable(ctx, p.desired.Unreachable)
			return err
		}
		// No key, all in the clear: nothing of an earlier run's may stay.
		if !w.cleaned {
			if err := wireguard.Remove(ctx, w.cfg.Device); err != nil {
				return err
			}
			w.cleaned = true
		}
		return nil
	}
	if w.dev == nil {
		dev, err := wireguard.Open(ctx, wireguard.Options{Name: w.cfg.Device, MTU: p.desired.MTU, Userspace: w.cfg.Userspace, Logger: w.log})
		if err != nil {
			// Fail closed: the keyed peers are out of VXLAN already, and
			// without a route their packets would take the default route,
			// in the clear. Retried with the next reconcile.
			_, uerr := wireguard.ApplyUnreachable(ctx, p.desired.Unreachable)
			return errors.Join(err, uerr)
		}
		w.dev = dev
		w.status.Device, w.status.Implementation = dev.Name(), string(dev.Implementation())
	}
	p.desired.PrivateKey = p.key
	if !p.keyed {
		p.desired.PrivateKey = w.key // no peers: the key matters to nobody yet
	}
	rep, err := w.dev.Apply(ctx, &p.desired)
	if rep.Changes() > 0 || len(rep.Rejected) > 0 {
		w.log.Info("wireguard applied", "peers_added", rep.PeersAdded, "peers_updated", rep.PeersUpdated, "peers_removed", rep.PeersRemoved,
			"routes_set", rep.RoutesSet, "routes_removed", rep.RoutesRemoved, "rejected", rep.Rejected, "took", rep.Duration)
	}
	return err
}

// Close releases the device (the kernel's stays, with its peers and
// routes).
func (w *WireGuard) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dev != nil {
		w.dev.Close()
		w.dev = nil
	}
}

// Status is the agent's encryption as it runs; registered is the key this
// agent's signed record carries ("" before one).
func (w *WireGuard) Status(registered string) *api.WireGuardStatus {
	key := w.RegisterKey()
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.status
	st.PublicKey, st.RegisteredKey, st.Rotations = key, registered, w.rotations
	return &st
}
