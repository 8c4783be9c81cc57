// Package ringgossip carries one overlay's ring over a gossip channel:
// broadcast on every local change, periodic gossip of the whole ring (mesh
// drives it), and a unicast request/answer by which a peer that ran out of
// space asks another for some (the grant exchange).
//
// The exchange: the requester picks a donor with Ring.ChoosePeerToAsk and
// sends it a request with an id; the donor grants a block (Allocator.Donate),
// broadcasts its ring and answers with the prefix and its ring; the requester
// merges the ring and now owns the prefix. Requests are resent with the same
// id until answered, and a donor answers a repeated id with the grant it
// already made, so lost and duplicated messages grant nothing twice.
package ringgossip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// ErrNoDonor is returned by RequestSpace when no peer has free space to ask
// for, or every peer asked refused.
var ErrNoDonor = errors.New("ringgossip: no peer can give space")

// Config configures a Peer.
type Config struct {
	// Router is the process's gossip router, shared with other users.
	Router gossip.Router
	// Channel names the gossip channel; one per overlay, e.g. "ring/carve".
	Channel string
	// Allocator is this peer's allocator of the overlay; the Peer owns it
	// from now on: reach it only through Update and View.
	Allocator *ring.Allocator
	// Seed seeds the choice of donors; 0 draws one.
	Seed uint64
	// RetryInterval is how long a request waits for an answer before it
	// is sent again; 0 means 500 ms.
	RetryInterval time.Duration
	// Attempts is how many times a request goes to one donor before the
	// requester tries another; 0 means 4.
	Attempts int
	// Logger receives refused merges and bad messages; nil discards them.
	Logger *slog.Logger
}

// Peer is one peer's replica of a ring, gossiped. It is safe for concurrent
// use.
type Peer struct {
	self     string
	ch       gossip.Channel
	log      *slog.Logger
	retry    time.Duration
	attempts int

	mu      sync.Mutex
	alloc   *ring.Allocator
	rng     *rand.Rand
	nextID  uint64
	waiting map[uint64]chan answer
	granted map[string]grant // donor side: the last grant per requester
}

type grant struct {
	id     uint64
	prefix netip.Prefix
}

type answer struct {
	prefix netip.Prefix
	err    error
}

// New registers the ring's channel on the router (with mesh, before the
// router starts) and returns the peer.
func New(cfg Config) (*Peer, error) {
	if cfg.Router == nil || cfg.Allocator == nil {
		return nil, errors.New("ringgossip: router and allocator are required")
	}
	if cfg.Allocator.Self() != cfg.Router.Self() {
		return nil, fmt.Errorf("ringgossip: allocator is for %q, router for %q", cfg.Allocator.Self(), cfg.Router.Self())
	}
	name := cfg.Channel
	if name == "" {
		name = "ring"
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	p := &Peer{
		self:     cfg.Allocator.Self(),
		log:      cfg.Logger,
		retry:    cfg.RetryInterval,
		attempts: cfg.Attempts,
		alloc:    cfg.Allocator,
		rng:      rand.New(rand.NewPCG(seed, 0)),
		waiting:  map[uint64]chan answer{},
		granted:  map[string]grant{},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.log = p.log.With("peer", p.self, "channel", name)
	if p.retry <= 0 {
		p.retry = 500 * time.Millisecond
	}
	if p.attempts <= 0 {
		p.attempts = 4
	}
	ch, err := cfg.Router.Channel(name, (*handler)(p))
	if err != nil {
		return nil, err
	}
	p.ch = ch
	return p, nil
}

// Update runs fn with the allocator under the peer's lock (an allocation,
// a seed from the master's leases, a transfer, ...), and broadcasts the ring
// if fn changed it. fn must not call the Peer.
func (p *Peer) Update(fn func(*ring.Allocator) error) error {
	p.mu.Lock()
	before := p.alloc.RingChanges()
	err := fn(p.alloc)
	var enc []byte
	if p.alloc.RingChanges() != before {
		enc = p.alloc.EncodeRing()
	}
	p.mu.Unlock()
	if enc != nil {
		p.ch.Broadcast(ringData{enc})
	}
	return err
}

// View runs fn with the allocator under the peer's lock, for reading.
func (p *Peer) View(fn func(*ring.Allocator)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p.alloc)
}

// Broadcast sends the ring to every peer now.
func (p *Peer) Broadcast() {
	p.mu.Lock()
	enc := p.alloc.EncodeRing()
	p.mu.Unlock()
	p.ch.Broadcast(ringData{enc})
}

// RequestSpace asks peers for a block of addresses until one grants it,
// and returns the block, which this peer then owns. It picks donors at
// random in proportion to their free space, skipping those that refuse or do
// not answer.
func (p *Peer) RequestSpace(ctx context.Context) (netip.Prefix, error) {
	exclude := []string{p.self}
	for {
		p.mu.Lock()
		donor, ok := p.alloc.Ring().ChoosePeerToAsk(p.rng, exclude...)
		p.nextID++
		id := p.nextID
		wait := make(chan answer, 1)
		p.waiting[id] = wait
		p.mu.Unlock()
		if !ok {
			p.forget(id)
			return netip.Prefix{}, ErrNoDonor
		}
		ans, answered, err := p.ask(ctx, donor, id, wait)
		p.forget(id)
		switch {
		case err != nil:
			return netip.Prefix{}, err
		case answered && ans.err == nil:
			return ans.prefix, nil
		case answered && !errors.Is(ans.err, ring.ErrNothingToDonate):
			return netip.Prefix{}, ans.err
		}
		p.log.Debug("donor gave nothing", "donor", donor, "answered", answered)
		exclude = append(exclude, donor)
	}
}

// ask sends one request to donor until it is answered or the attempts run
// out.
func (p *Peer) ask(ctx context.Context, donor string, id uint64, wait chan answer) (answer, bool, error) {
	msg := binary.AppendUvarint([]byte{msgRequest}, id)
	timer := time.NewTimer(p.retry)
	defer timer.Stop()
	for range p.attempts {
		if err := p.ch.Unicast(donor, msg); err != nil {
			p.log.Debug("request not sent", "donor", donor, "err", err)
			return answer{}, false, nil
		}
		timer.Reset(p.retry)
		select {
		case a := <-wait:
			return a, true, nil
		case <-timer.C:
		case <-ctx.Done():
			return answer{}, false, fmt.Errorf("ringgossip: space request: %w", ctx.Err())
		}
	}
	return answer{}, false, nil
}

func (p *Peer) forget(id uint64) {
	p.mu.Lock()
	delete(p.waiting, id)
	p.mu.Unlock()
}

// Unicast messages: a type byte, then
//
//	request: uvarint id
//	answer:  uvarint id, status byte, and when granted: prefix (family
//	         byte, address, length byte) then the donor's encoded ring
const (
	msgRequest = 1
	msgAnswer  = 2

	statusGranted = 0
	statusNothing = 1
)

func appendAnswer(b []byte, id uint64, p netip.Prefix, enc []byte) []byte {
	b = binary.AppendUvarint(append(b, msgAnswer), id)
	if !p.IsValid() {
		return append(b, statusNothing)
	}
	b = append(b, statusGranted)
	if p.Addr().Is4() {
		b = append(b, 4)
	} else {
		b = append(b, 6)
	}
	b = append(b, p.Addr().AsSlice()...)
	b = append(b, byte(p.Bits()))
	return append(b, enc...)
}

var errBadMessage = errors.New("ringgossip: malformed message")

// parseAnswer reads an answer after its type byte.
func parseAnswer(b []byte) (id uint64, p netip.Prefix, enc []byte, err error) {
	id, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+1 {
		return 0, netip.Prefix{}, nil, errBadMessage
	}
	b = b[n:]
	switch b[0] {
	case statusNothing:
		if len(b) != 1 {
			return 0, netip.Prefix{}, nil, errBadMessage
		}
		return id, netip.Prefix{}, nil, nil
	case statusGranted:
	default:
		return 0, netip.Prefix{}, nil, errBadMessage
	}
	b = b[1:]
	size := 0
	switch {
	case len(b) > 0 && b[0] == 4:
		size = 4
	case len(b) > 0 && b[0] == 6:
		size = 16
	default:
		return 0, netip.Prefix{}, nil, errBadMessage
	}
	if len(b) < 2+size {
		return 0, netip.Prefix{}, nil, errBadMessage
	}
	addr, _ := netip.AddrFromSlice(b[1 : 1+size])
	p = netip.PrefixFrom(addr, int(b[1+size]))
	if !p.IsValid() || p.Masked() != p {
		return 0, netip.Prefix{}, nil, errBadMessage
	}
	return id, p, b[2+size:], nil
}

// ringData is an encoded ring in flight; coalescing two is their join.
type ringData struct{ b []byte }

func (d ringData) Encode() [][]byte { return [][]byte{d.b} }

func (d ringData) Merge(o gossip.Data) gossip.Data {
	od, ok := o.(ringData)
	if !ok {
		return o
	}
	a, err := ring.Decode(d.b)
	if err != nil {
		return od
	}
	b, err := ring.Decode(od.b)
	if err != nil {
		return d
	}
	if _, err := a.Merge(b); err != nil {
		return od // cannot be joined: the later one wins
	}
	return ringData{a.Encode()}
}

// handler is the gossip.Handler side of a Peer.
type handler Peer

func (h *handler) peer() *Peer { return (*Peer)(h) }

// Gossip reports fresh free counts into the ring, then returns it.
func (h *handler) Gossip() gossip.Data {
	p := h.peer()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.alloc.SyncFree(); err != nil {
		p.log.Warn("free counts not reported", "err", err)
	}
	return ringData{p.alloc.EncodeRing()}
}

// merge joins a received ring; it returns the new ring when it changed.
func (p *Peer) merge(msg []byte) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed, err := p.alloc.MergeEncoded(msg)
	if err != nil {
		return nil, err
	}
	if !changed {
		return nil, nil
	}
	return p.alloc.EncodeRing(), nil
}

func (h *handler) OnGossip(msg []byte) (gossip.Data, error) {
	enc, err := h.peer().merge(msg)
	if err != nil || enc == nil {
		return nil, err
	}
	return ringData{enc}, nil
}

// OnBroadcast relays the merged ring even when it brought nothing new here:
// peers further along the broadcast tree may not have it.
func (h *handler) OnBroadcast(src string, msg []byte) (gossip.Data, error) {
	p := h.peer()
	if _, err := p.merge(msg); err != nil {
		return nil, fmt.Errorf("ring from %s: %w", src, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return ringData{p.alloc.EncodeRing()}, nil
}

func (h *handler) OnUnicast(src string, msg []byte) error {
	p := h.peer()
	if len(msg) == 0 {
		return errBadMessage
	}
	switch msg[0] {
	case msgRequest:
		id, n := binary.Uvarint(msg[1:])
		if n <= 0 || n != len(msg)-1 {
			return errBadMessage
		}
		return p.donate(src, id)
	case msgAnswer:
		id, prefix, enc, err := parseAnswer(msg[1:])
		if err != nil {
			return err
		}
		p.answered(src, id, prefix, enc)
		return nil
	}
	return fmt.Errorf("%w: type %d", errBadMessage, msg[0])
}

// donate is the donor's side: grant once per request id, answer every time.
func (p *Peer) donate(src string, id uint64) error {
	p.mu.Lock()
	g, seen := p.granted[src]
	changed := false
	if !seen || g.id != id {
		g = grant{id: id}
		prefix, err := p.alloc.Donate(src)
		switch {
		case err == nil:
			g.prefix, changed = prefix, true
		case !errors.Is(err, ring.ErrNothingToDonate):
			p.log.Warn("donation failed", "to", src, "err", err)
		}
		p.granted[src] = g
	}
	enc := p.alloc.EncodeRing()
	p.mu.Unlock()
	if changed {
		p.log.Info("granted space", "to", src, "prefix", g.prefix)
		p.ch.Broadcast(ringData{enc})
	}
	var ringBytes []byte
	if g.prefix.IsValid() {
		ringBytes = enc
	}
	return p.ch.Unicast(src, appendAnswer(nil, id, g.prefix, ringBytes))
}

// answered is the requester's side: merge the donor's ring, check that the
// prefix is ours now, and wake the waiting request.
func (p *Peer) answered(src string, id uint64, prefix netip.Prefix, enc []byte) {
	a := answer{prefix: prefix}
	var relay []byte
	p.mu.Lock()
	if !prefix.IsValid() {
		a.err = ring.ErrNothingToDonate
	} else if changed, err := p.alloc.MergeEncoded(enc); err != nil {
		a.err = fmt.Errorf("ringgossip: ring from donor %s: %w", src, err)
	} else {
		if changed {
			relay = p.alloc.EncodeRing()
		}
		if owner, _ := p.alloc.Ring().Owner(prefix.Addr()); owner != p.self {
			a.err = fmt.Errorf("ringgossip: donor %s granted %v but the ring gives it to %q", src, prefix, owner)
		}
	}
	wait := p.waiting[id]
	p.mu.Unlock()
	if relay != nil {
		p.ch.Broadcast(ringData{relay})
	}
	if wait == nil {
		return // a late or repeated answer: its ring was still worth merging
	}
	select {
	case wait <- a:
	default:
	}
}
