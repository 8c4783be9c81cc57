package wireguard

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// RehandshakeAfter is how long a peer put in (new, re-keyed, or all of
// them after a new own key) may go without a handshake before it is put
// in once more; each later check waits twice as long, up to
// maxRehandshakeWait.
//
// Why: a peer put in starts a handshake at once (its first keepalive),
// but when both sides change their configuration at about the same moment
// (a key rotation: the rotating host takes its new key as its peers learn
// it), each side's first initiation can reach the other before the other
// changed, and both are dropped; WireGuard retries only after 5 s. Put in
// again, a peer starts a new handshake at once, by then to a side that
// most likely knows the new key; when the other side is later still (a
// host starved of CPU), the next check puts it in again.
const RehandshakeAfter = time.Second

// maxRehandshakeWait is the longest wait between two checks of one peer:
// with RehandshakeAfter at 1 s, a peer without a handshake is put in again
// 1, 3 and 7 s after it was put in, and then left to WireGuard's own
// retries (every 5 s), so that a peer that is down costs no more than
// WireGuard alone would.
const maxRehandshakeWait = 4 * time.Second

// putInPeer is a peer waiting for its first handshake since it was put
// in.
type putInPeer struct {
	// at is when the configuration that put it in was sent, taken before
	// the device was told: a handshake that completes while the
	// configuration call returns counts as one since.
	at time.Time
	// wait is how long after at it is checked.
	wait time.Duration
}

// notePutIn remembers the peers a configuration sent at at put in, and
// schedules the check for their first handshake. d.mu is held.
func (d *Device) notePutIn(cfg *wgtypes.Config, at time.Time) {
	for _, pc := range cfg.Peers {
		if !pc.Remove {
			d.putIn[pc.PublicKey] = putInPeer{at: at, wait: RehandshakeAfter}
		}
	}
	d.scheduleRehandshake()
}

// scheduleRehandshake arms the check for the peer due first (none: the
// timer stays as it is, and finds nothing). d.mu is held.
func (d *Device) scheduleRehandshake() {
	if len(d.putIn) == 0 || d.closed {
		return
	}
	var next time.Duration
	first := true
	for _, p := range d.putIn {
		if due := time.Until(p.at.Add(p.wait)); first || due < next {
			next, first = due, false
		}
	}
	next = max(next, 10*time.Millisecond)
	if d.rehandshake == nil {
		d.rehandshake = time.AfterFunc(next, d.rehandshakeNow)
		return
	}
	d.rehandshake.Reset(next)
}

// rehandshakeNow puts in once more every peer due for its check that has
// had no handshake since it was put in, and checks it again later
// (twice the wait, up to maxRehandshakeWait).
func (d *Device) rehandshakeNow() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || len(d.putIn) == 0 {
		return
	}
	cur, err := d.client.Device(d.name)
	if err != nil {
		d.log.Warn("wireguard: read the device for the handshake check", "err", err)
		d.rehandshake.Reset(RehandshakeAfter) // the peers still wait: try again
		return
	}
	// The peers still waiting (put in again, not due yet) are checked again.
	defer d.scheduleRehandshake()
	now := time.Now()
	var cfg wgtypes.Config
	var again []string
	waits := map[wgtypes.Key]time.Duration{}
	onDevice := map[wgtypes.Key]bool{}
	for _, p := range cur.Peers {
		onDevice[p.PublicKey] = true
		st, ok := d.putIn[p.PublicKey]
		if !ok || now.Sub(st.at) < st.wait {
			continue
		}
		if p.LastHandshakeTime.After(st.at) {
			delete(d.putIn, p.PublicKey)
			continue
		}
		if st.wait > maxRehandshakeWait {
			// WireGuard's own retries from here on.
			delete(d.putIn, p.PublicKey)
			d.log.Warn("wireguard: still no handshake with a peer put in again; left to WireGuard's retries (every 5 s)",
				"peer", p.PublicKey.String(), "endpoint", p.Endpoint, "since", st.at)
			continue
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, Remove: true}, wgtypes.PeerConfig{
			PublicKey: p.PublicKey, Endpoint: p.Endpoint, ReplaceAllowedIPs: true, AllowedIPs: p.AllowedIPs,
			PersistentKeepaliveInterval: ptr(Keepalive),
		})
		waits[p.PublicKey] = 2 * st.wait
		again = append(again, p.PublicKey.String())
	}
	for k := range d.putIn {
		if !onDevice[k] {
			delete(d.putIn, k) // gone from the device meanwhile
		}
	}
	if len(cfg.Peers) == 0 {
		return
	}
	at := time.Now()
	if err := d.client.ConfigureDevice(d.name, cfg); err != nil {
		// Checked again after the same wait, which the next turn retries.
		for k := range waits {
			d.putIn[k] = putInPeer{at: at, wait: d.putIn[k].wait}
		}
		d.log.Warn("wireguard: put peers in again for a handshake", "peers", again, "err", err)
		return
	}
	for k, wait := range waits {
		d.putIn[k] = putInPeer{at: at, wait: wait}
	}
	d.log.Info("wireguard: peers without a handshake put in again", "peers", again)
}
