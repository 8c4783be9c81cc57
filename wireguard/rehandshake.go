package wireguard

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// RehandshakeAfter is how long a peer put in (new, re-keyed, or all of
// them after a new own key) may go without a handshake before it is put
// in once more.
//
// Why: a peer put in starts a handshake at once (its first keepalive),
// but when both sides change their configuration at the same moment (a
// key rotation: the rotating host takes its new key as its peers learn
// it), each side's first initiation can reach the other before the other
// changed, and both are dropped; WireGuard retries only after 5 s. Put in
// again, a peer starts a new handshake at once, by then to a side that
// knows the new key.
const RehandshakeAfter = time.Second

// notePutIn remembers the peers a configuration put in, and schedules the
// check for their first handshake. d.mu is held.
func (d *Device) notePutIn(cfg *wgtypes.Config) {
	now := time.Now()
	for _, pc := range cfg.Peers {
		if !pc.Remove {
			d.putIn[pc.PublicKey] = now
		}
	}
	if len(d.putIn) == 0 || d.closed {
		return
	}
	if d.rehandshake == nil {
		d.rehandshake = time.AfterFunc(RehandshakeAfter, d.rehandshakeNow)
		return
	}
	d.rehandshake.Reset(RehandshakeAfter)
}

// rehandshakeNow puts in once more every peer put in at least
// RehandshakeAfter ago that has had no handshake since.
func (d *Device) rehandshakeNow() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || len(d.putIn) == 0 {
		return
	}
	cur, err := d.client.Device(d.name)
	if err != nil {
		d.log.Warn("wireguard: read the device for the handshake check", "err", err)
		return
	}
	var cfg wgtypes.Config
	var again []string
	for _, p := range cur.Peers {
		since, ok := d.putIn[p.PublicKey]
		if !ok || time.Since(since) < RehandshakeAfter {
			continue
		}
		delete(d.putIn, p.PublicKey)
		if p.LastHandshakeTime.After(since) {
			continue
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, Remove: true}, wgtypes.PeerConfig{
			PublicKey: p.PublicKey, Endpoint: p.Endpoint, ReplaceAllowedIPs: true, AllowedIPs: p.AllowedIPs,
			PersistentKeepaliveInterval: ptr(Keepalive),
		})
		again = append(again, p.PublicKey.String())
	}
	for k, since := range d.putIn {
		if time.Since(since) >= RehandshakeAfter {
			delete(d.putIn, k) // gone from the device meanwhile
		}
	}
	if len(d.putIn) > 0 {
		d.rehandshake.Reset(RehandshakeAfter)
	}
	if len(cfg.Peers) == 0 {
		return
	}
	if err := d.client.ConfigureDevice(d.name, cfg); err != nil {
		d.log.Warn("wireguard: put peers in again for a handshake", "peers", again, "err", err)
		return
	}
	d.log.Info("wireguard: peers without a handshake put in again", "peers", again)
}
