// Package spaceask is the asking side of growth through the ring: when
// the masters have no block for a bridge (or cannot be reached), an agent
// asks a peer for one with a signed space request, unicast on the ring
// channel to a peer chosen by its free space in the ring
// (ring.Ring.ChoosePeerToAsk), resent until answered, and hands the answer
// to its owner (Host.Accept), which merges the answer's ring: the grant
// counts only once the merged ring gives the block to this agent. It keeps
// the requests in flight (each answer goes to the request it answers, from
// the peer asked), which bridge each overlay family asks space for, the
// peers' refusals (not asked again for a while unless their free count
// grew), and the random source of peer choices and request ids. The
// donor's side, and everything that changes the overlays, is its owner's.
//
// Lock order: the owner's lock, then the asker's own; the asker never
// calls its owner with its own lock held.
//
// Its exported surface is this file.
package spaceask

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// Errors of asking, for callers that branch.
var (
	// ErrOverlayFull marks a growth that found space nowhere: not at the
	// masters, and no peer reports a free address in the ring (the
	// overlay's whole space is in use).
	ErrOverlayFull = errors.New("overlay full")
	// ErrNoDonor marks a growth that got no block although peers report
	// free addresses: each refused (it keeps what it needs), did not
	// answer or could not be reached.
	ErrNoDonor = errors.New("no peer granted space")
)

// RefusedError is a peer's refusal to grant space (or its answer's, as
// Host.Accept judged it).
type RefusedError struct{ Peer, Reason string }

func (e *RefusedError) Error() string { return fmt.Sprintf("peer %s refused: %s", e.Peer, e.Reason) }

// MinSpareFree is the least free count a peer's ring entries must show
// for the peer to be asked: a donor grants no block smaller than four
// addresses and keeps at least as much as it gives, and the ring's free
// count of a peer is never below what it may give (it counts its bridges'
// network and broadcast addresses too). Fewer, and asking only costs a
// refusal.
const MinSpareFree = 8

// Host is the owner of the overlays an asker asks space for (the IPAM).
type Host interface {
	// Ring returns, under the owner's lock, a copy of an overlay family's
	// ring and the prefix length of the bridge's first block; ok is false
	// when the family is not served or there is no ring channel.
	Ring(overlay, bridge string, fam int) (r *ring.Ring, bits int, ok bool)
	// Channel returns the ring channel and this agent's cluster id.
	Channel() (gossip.Channel, string)
	// Sign signs a space request with this agent's claim key.
	Sign(m *ipamwire.SpaceMessage)
	// Accept takes a peer's answer to a request for a bridge family's
	// space: nil once the merged ring gives this agent the block, else a
	// *RefusedError.
	Accept(overlay, bridge string, fam int, peer string, ans ipamwire.SpaceMessage) error
}

// Config configures an Asker.
type Config struct {
	// Self is this agent's id.
	Self string
	Host Host
	// Seed seeds the peer choices and the request ids.
	Seed uint64
	// AnswerTimeout is how long a request waits for an answer before it
	// is sent again (three sends per peer).
	AnswerTimeout time.Duration
	// RefuseMemory is how long a peer that refused is not asked again
	// while its free count in the ring stays as it was.
	RefuseMemory time.Duration
	// Grows counts growth attempts by path and result; Refused counts
	// refusals by reason.
	Grows, Refused *prometheus.CounterVec
}

// Asker asks peers for space.
type Asker struct {
	cfg Config

	mu  sync.Mutex
	rng *rand.Rand
	// asking: the bridge an overlay family asks space for now.
	asking  map[[2]string]string
	waiting map[string]waiter
	refused map[[2]string]peerRefusal // overlay, peer -> its last refusal
}

// waiter is a space request waiting for its answer.
type waiter struct {
	peer string
	ch   chan ipamwire.SpaceMessage
}

// peerRefusal is a peer's last refusal (or silence) in an overlay: it is
// not asked again for RefuseMemory, unless its free count in the ring
// grew since (it freed addresses: it may grant now).
type peerRefusal struct {
	when time.Time
	free ring.Uint128 // the peer's free count in the ring then
	why  string       // the refusal, for the error that ends a growth
}

// New returns an asker.
func New(cfg Config) *Asker {
	return &Asker{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6772)),
		asking: map[[2]string]string{}, waiting: map[string]waiter{}, refused: map[[2]string]peerRefusal{}}
}

// RequestID is a fresh id for a request to the masters or a peer.
func (a *Asker) RequestID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprintf("%s-%016x", a.cfg.Self, a.rng.Uint64())
}

// AskingBridge is the bridge an overlay family asks space for now, and
// whether one does.
func (a *Asker) AskingBridge(overlay string, fam int) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.asking[[2]string{overlay, ipfamily.Name(fam)}]
	return b, ok
}

// freeByPeer sums each peer's free counts in a ring (a lease it has not
// reported on yet counts whole).
func freeByPeer(r *ring.Ring) map[string]ring.Uint128 {
	out := map[string]ring.Uint128{}
	for _, t := range r.Tokens() {
		if t.Owner != "" {
			out[t.Owner] = out[t.Owner].Add(t.Free)
		}
	}
	return out
}

// Ask asks peers for a block for a bridge family of an overlay, the ones
// with most free space most likely, each at most once, until one grants,
// none is left to ask or ctx ends. Peers that refused recently are left
// out while their free count is what it was. It fails with ErrOverlayFull
// when no peer has enough free addresses in the ring to spare a block
// (the overlay's space is in use), else with ErrNoDonor, naming each
// peer's refusal or silence. note, when set, is told each refusal.
func (a *Asker) Ask(ctx context.Context, overlay, bridge string, fam int, note func(string)) error {
	if fam == 1 {
		// Peers do not grant IPv6 space (ipamwire.ReasonIPv6NotGranted).
		a.cfg.Grows.WithLabelValues("ring", "none").Inc()
		return fmt.Errorf("%w: IPv6 space is leased by the masters only, never granted through the ring", ErrOverlayFull)
	}
	asked := map[string]bool{}
	var outcomes []string
	for {
		r, bits, ok := a.cfg.Host.Ring(overlay, bridge, fam)
		if !ok {
			return fmt.Errorf("%w: no ring channel to ask peers on", ErrNoDonor)
		}
		free := freeByPeer(r)
		exclude := []string{a.cfg.Self}
		var remembered []string
		spare, total := 0, ring.Uint128{} // peers that may spare a block; all peers' free
		peers := make([]string, 0, len(free))
		for p := range free {
			peers = append(peers, p)
		}
		sort.Strings(peers)
		a.mu.Lock()
		for _, p := range peers {
			if p == a.cfg.Self {
				continue
			}
			total = total.Add(free[p])
			if free[p].Less(ring.U128(MinSpareFree)) {
				exclude = append(exclude, p)
				continue
			}
			spare++
			switch ref, ok := a.refused[[2]string{overlay, p}]; {
			case asked[p]:
				exclude = append(exclude, p)
			case ok && time.Since(ref.when) < a.cfg.RefuseMemory && !ref.free.Less(free[p]):
				exclude = append(exclude, p)
				remembered = append(remembered, fmt.Sprintf("%s (%s ago)", ref.why, time.Since(ref.when).Round(time.Second)))
			}
		}
		peer, ok := r.ChoosePeerToAsk(a.rng, exclude...)
		a.mu.Unlock()
		if !ok {
			a.cfg.Grows.WithLabelValues("ring", "none").Inc()
			switch {
			case spare > 0:
				return fmt.Errorf("%w: %d peers report free space in the ring, and none granted a block: %s",
					ErrNoDonor, spare, strings.Join(append(outcomes, remembered...), "; "))
			case total.IsZero():
				return fmt.Errorf("%w: no peer reports a free address in the ring", ErrOverlayFull)
			}
			return fmt.Errorf("%w: no peer reports enough free addresses to spare a block (%s in all, fewer than %d at each peer, "+
				"its bridges' network and broadcast addresses included; a donor keeps at least as much as it gives, "+
				"and the smallest block is 4 addresses)", ErrOverlayFull, total, MinSpareFree)
		}
		asked[peer] = true
		err := a.askPeer(ctx, peer, overlay, bridge, fam, bits)
		if err == nil {
			a.cfg.Grows.WithLabelValues("ring", "ok").Inc()
			return nil
		}
		outcomes = append(outcomes, err.Error())
		reason := "no_answer"
		var re *RefusedError
		if errors.As(err, &re) {
			reason = re.Reason
		}
		a.cfg.Refused.WithLabelValues(reason).Inc()
		a.cfg.Grows.WithLabelValues("ring", "refused").Inc()
		a.mu.Lock()
		a.refused[[2]string{overlay, peer}] = peerRefusal{when: time.Now(), free: free[peer], why: err.Error()}
		a.mu.Unlock()
		if note != nil {
			note(err.Error())
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w before the growth's time ran out: %s", ErrNoDonor, strings.Join(outcomes, "; "))
		}
	}
}

// Expect registers a request in flight: the answer to request id from
// peer comes on answers (Answer); done forgets the request.
func (a *Asker) Expect(id, peer string) (answers <-chan ipamwire.SpaceMessage, done func()) {
	ch := make(chan ipamwire.SpaceMessage, 1)
	a.mu.Lock()
	a.waiting[id] = waiter{peer: peer, ch: ch}
	a.mu.Unlock()
	return ch, func() {
		a.mu.Lock()
		delete(a.waiting, id)
		a.mu.Unlock()
	}
}

// askPeer sends a space request to peer, resending it until it is answered;
// the grant counts once the merged ring gives this agent the block.
func (a *Asker) askPeer(ctx context.Context, peer, overlay, bridge string, fam, bits int) error {
	id := a.RequestID()
	ch, done := a.Expect(id, peer)
	defer done()
	key := [2]string{overlay, ipfamily.Name(fam)}
	a.mu.Lock()
	a.asking[key] = bridge
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.asking, key)
		a.mu.Unlock()
	}()
	channel, clusterID := a.cfg.Host.Channel()
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: clusterID, From: a.cfg.Self, ID: id,
		Overlay: overlay, Family: ipfamily.Name(fam), Bits: bits}
	a.cfg.Host.Sign(&req)
	msg := ipamwire.EncodeSpaceMessage(req)
	for range 3 {
		if err := channel.Unicast(peer, msg); err != nil {
			return fmt.Errorf("ask %s: %w", peer, err)
		}
		timer := time.NewTimer(a.cfg.AnswerTimeout)
		select {
		case ans := <-ch:
			timer.Stop()
			return a.cfg.Host.Accept(overlay, bridge, fam, peer, ans)
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
	return fmt.Errorf("peer %s did not answer", peer)
}

// Answer routes an answer (a grant or a refusal) received from src to the
// request in flight it answers; one that matches none, or comes from
// another peer than the one asked, is refused.
func (a *Asker) Answer(src string, m ipamwire.SpaceMessage) error {
	a.mu.Lock()
	w, ok := a.waiting[m.ID]
	a.mu.Unlock()
	if !ok || w.peer != src {
		return fmt.Errorf("%w: answer %q from %s matches no request in flight", ipamwire.ErrBadSpaceMessage, m.ID, src)
	}
	select {
	case w.ch <- m:
	default: // a duplicate answer
	}
	return nil
}
