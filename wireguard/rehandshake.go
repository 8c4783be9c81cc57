package wireguard

import (
	"bytes"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// RehandshakeAfter is how long a peer put in (new, re-keyed, or all of
// them after a new own key) may go without a handshake before it is put
// in once more; each later check waits twice as long, up to
// maxRehandshakeWait. The side whose public key is the greater of the two
// waits half as long again (see yieldTo).
//
// Why: a peer put in starts a handshake at once (its first keepalive),
// but when both sides change their configuration at about the same moment
// (a key rotation: the rotating host takes its new key as its peers learn
// it), the two initiations cross. Either each reaches the other before
// the other changed, and both are dropped; or each side answers the
// other's initiation, which replaces its own in WireGuard's one handshake
// per peer, so that the answer to its own is refused ("Received invalid
// response message") and both sides are left as responders waiting for a
// first packet that neither sends. WireGuard retries only after 5 s (with
// at most a third of a second of jitter, too little for two hosts slowed
// by a busy machine). Put in again, a peer starts a new handshake at once.
const RehandshakeAfter = time.Second

// maxRehandshakeWait is the longest wait between two checks of one peer:
// with RehandshakeAfter at 1 s, a peer without a handshake is put in again
// 1, 3 and 7 s after it was put in, and then left to WireGuard's own
// retries (every 5 s), so that a peer that is down costs no more than
// WireGuard alone would.
const maxRehandshakeWait = 4 * time.Second

// sampleWindow is how long a peer whose handshake came after its first
// sample is watched for a one-sided session: sending but receiving
// nothing. Two initiations that cross can leave that behind in
// wireguard-go too (each side answers the other's while its own answer is
// processed by another goroutine; seen in the lab: both sides logged a
// handshake, and one sent pings into a session the other did not hold),
// and WireGuard only notices after 15 s without an answer ("stopped
// hearing back"). So every peer put in is sampled (its byte counters)
// half a wait after, and judged at its check: sent since, received
// nothing. A one-way flow on a healthy session looks the same for that
// moment; putting it in again costs a round trip.
const sampleWindow = 500 * time.Millisecond

// yieldTo tells whether this side, with public key own, waits longer
// than peer before putting it in again. Both sides put each other in at the
// same moment in a rotation, so checks after the same wait would put both
// in again at the same moment, and the two new initiations would cross
// again, at every check (seen in the lab: three crossings in a row, 7 s
// without a session). The order of the two public keys, which both sides
// know, lets one side go first.
func yieldTo(own, peer wgtypes.Key) bool {
	return bytes.Compare(own[:], peer[:]) > 0
}

// dueAt is when the next step for peer k is due: its sample half a wait
// after it was put in, its check a wait after (or a sampleWindow after a
// sample taken again), and half that more on the side that yields.
func (d *Device) dueAt(k wgtypes.Key, p putInPeer) time.Time {
	var due time.Time
	offset := p.wait / 2
	switch p.phase {
	case phaseSample:
		due = p.at.Add(p.wait / 2)
	case phaseCheck:
		due = p.at.Add(p.wait)
	default:
		due, offset = p.sampledAt.Add(sampleWindow), sampleWindow/2
	}
	if yieldTo(d.own, k) {
		due = due.Add(offset)
	}
	return due
}

// The steps of a peer put in.
const (
	// phaseSample: its byte counters are read half a wait after it was
	// put in.
	phaseSample = iota
	// phaseCheck: a wait after it was put in, it is put in again without
	// a handshake since, or with a session that sent and received
	// nothing since the sample.
	phaseCheck
	// phaseWindow: its handshake came after the sample, so it is sampled
	// again and judged a sampleWindow later.
	phaseWindow
)

// putInPeer is a peer put in, waiting for its first handshake since, or
// watched for a one-sided session after it.
type putInPeer struct {
	// at is when the configuration that put it in was sent, taken before
	// the device was told: a handshake that completes while the
	// configuration call returns counts as one since.
	at time.Time
	// wait is how long after at it is checked.
	wait time.Duration
	// phase is its next step; rx and tx are its byte counters at its
	// sample (taken at sampledAt).
	phase     int
	sampledAt time.Time
	rx, tx    int64
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
	for k, p := range d.putIn {
		if due := time.Until(d.dueAt(k, p)); first || due < next {
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
// had no handshake since it was put in, or whose session since only sent,
// and checks it again later (twice the wait, up to maxRehandshakeWait);
// it takes the peers' samples too (see dueAt).
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
	d.own = cur.PublicKey
	now := time.Now()
	var cfg wgtypes.Config
	var again []string
	waits := map[wgtypes.Key]time.Duration{}
	onDevice := map[wgtypes.Key]bool{}
	for _, p := range cur.Peers {
		onDevice[p.PublicKey] = true
		st, ok := d.putIn[p.PublicKey]
		if !ok || now.Before(d.dueAt(p.PublicKey, st)) {
			continue
		}
		switch {
		case st.phase == phaseSample:
			st.phase, st.sampledAt, st.rx, st.tx = phaseCheck, now, p.ReceiveBytes, p.TransmitBytes
			d.putIn[p.PublicKey] = st
			continue
		case !p.LastHandshakeTime.After(st.at):
			// No handshake since it was put in: put in again, below.
		case p.LastHandshakeTime.After(st.sampledAt):
			// The handshake came after the sample: a window of its own.
			st.phase, st.sampledAt, st.rx, st.tx = phaseWindow, now, p.ReceiveBytes, p.TransmitBytes
			d.putIn[p.PublicKey] = st
			continue
		case p.TransmitBytes == st.tx || p.ReceiveBytes != st.rx:
			delete(d.putIn, p.PublicKey) // traffic both ways, or none to judge by
			continue
		default:
			d.log.Info("wireguard: a peer's session since its handshake only sends", "peer", p.PublicKey.String(),
				"sent_bytes", p.TransmitBytes-st.tx, "over", now.Sub(st.sampledAt).Round(time.Millisecond))
		}
		if st.wait > maxRehandshakeWait {
			// WireGuard's own retries from here on.
			delete(d.putIn, p.PublicKey)
			d.log.Warn("wireguard: still no session with a peer put in again three times; left to WireGuard's retries (every 5 s)",
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
	d.log.Info("wireguard: peers without a handshake, or whose session only sent, put in again", "peers", again)
}
