// Package growth runs the growths of the IPAM's bridges. A bridge starts
// with its first sub-subnet (the masters' lease). When its free addresses
// fall below a low-water mark, the agent gets another block in the
// background: first from the masters (BlockSource.Grow, a lease committed
// in Raft), and when they have none left or cannot be reached, from a peer
// through the ring: a unicast space request on the ring channel to a peer
// chosen by free space (ring.Ring.ChoosePeerToAsk), which grants a
// CIDR-aligned free block of its own ranges (ring.Allocator DonateBlock,
// the choice in Donate), persists and broadcasts its ring, and answers
// with it. Only the ring CRDT decides who owns what: the recipient owns the
// block once the merged ring says so, whatever an answer claims. The
// recipient reports the grant to the masters through a durable outbox. A
// grown block that stays empty for Config.IdleReturn goes back: to its
// donor with a grant back through the ring, or to the masters
// (BlockSource.Return).
//
// It decides when to grow and whom to ask first, and waits; the overlay
// table (the IPAM, behind Table) makes a block its own, asks peers, and
// says how much is free. Its state is under the table's lock.
package growth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipfamily"
)

// BlockSource is the masters' side of growth. The agent wires it to its
// masters' client; ipam knows nothing of HTTP or Raft.
type BlockSource interface {
	// Grow asks for another block for a bridge of an overlay (family 4 or
	// 6), committed before the answer. ErrMastersExhausted: the masters
	// have no free block left; any other error: no master answered.
	Grow(ctx context.Context, overlay, bridge string, family int, requestID string) (LeasedBlock, error)
	// Return gives a grown block back to the masters' free pool.
	Return(ctx context.Context, r ReturnReport) error
	// ReportGrant tells the masters of a grant made through the ring, so
	// that they never lease that space to anyone else.
	ReportGrant(ctx context.Context, g GrantReport) error
}

// LeasedBlock is a block the masters leased on a grow request.
type LeasedBlock struct {
	Prefix netip.Prefix
	// Version is the Raft index of the lease (its version in the ring).
	Version uint64
	// Held, when set, are every block of the agent's record in the
	// overlay family, at Version (the record the grow answered): the
	// agent's complete lease set, seeded as such.
	Held []netip.Prefix
}

// GrantReport is a grant through the ring, as the masters learn it.
type GrantReport struct {
	Overlay   string
	Prefix    netip.Prefix
	Donor     string
	Recipient string
	// Bridge is the recipient's bridge the block serves ("": mesos).
	Bridge    string
	RequestID string
	// Expires and DonorSignature are the donor's signed statement of the
	// grant (api.GrantSigningBytes), reported with it.
	Expires        int64
	DonorSignature string
}

// ReturnReport gives back a block (api.ReturnRequest): the version at which
// the masters' record listed it and the restore epoch of that record name
// the lease it gives back.
type ReturnReport struct {
	Overlay      string
	Prefix       netip.Prefix
	RequestID    string
	Version      uint64
	RestoreEpoch uint64
}

// Errors of growth, for callers that branch.
var (
	// ErrMastersExhausted is BlockSource.Grow's answer when the masters have
	// no free block left for the overlay.
	ErrMastersExhausted = errors.New("the masters have no free block left")
	// ErrQuota is BlockSource.Grow's answer when the masters refused the
	// block for the agent's quota (quota_prefix): the agent holds all the
	// grown and granted space it may, so it asks no peer either (the
	// masters would refuse the grant's report just the same).
	ErrQuota = errors.New("this agent holds its quota of grown and granted space")
	// ErrStillGrowing marks a growth still in flight when the ADD's wait
	// ended.
	ErrStillGrowing = errors.New("still growing")
)

// Config configures growth; the zero value grows through the ring only.
type Config struct {
	// Source is the masters; nil: only peers are asked.
	Source BlockSource
	// LowWater is the number of free addresses of a bridge (per family)
	// below which it grows in the background; 0: max(2, 1/8 of its first
	// block); negative: only when an allocation finds it full.
	LowWater int
	// Wait bounds how long an allocation that finds its bridge full waits
	// for the growth in flight; 0: 10s.
	Wait time.Duration
	// IdleReturn is how long a grown block stays empty before it goes
	// back; 0: 10 minutes; negative: never.
	IdleReturn time.Duration
	// AnswerTimeout is how long a space request waits for an answer before
	// it is sent again (three sends per peer); 0: 1s.
	AnswerTimeout time.Duration
	// RefuseMemory is how long a peer that refused is not asked again
	// while its free count in the ring stays as it was; 0: 1m.
	RefuseMemory time.Duration
	// UsageInterval is the least time between two usage reports to the
	// masters (sent when the counts change; see agent/ipam's usage.go);
	// 0: 5s; negative: none.
	UsageInterval time.Duration
	// UsageRefresh is the most time between two usage reports; 0: 1m.
	UsageRefresh time.Duration
	// Seed seeds the choice of the peer to ask; 0 draws one.
	Seed uint64
	// OnChange is called, without locks held, when blocks or rings changed
	// (the agent reconciles gateways and routes).
	OnChange func()
}

// WithDefaults fills in the defaults of growth's own fields (not the usage
// reports').
func (cfg Config) WithDefaults() Config {
	if cfg.Wait <= 0 {
		cfg.Wait = 10 * time.Second
	}
	if cfg.IdleReturn == 0 {
		cfg.IdleReturn = 10 * time.Minute
	}
	if cfg.AnswerTimeout <= 0 {
		cfg.AnswerTimeout = time.Second
	}
	if cfg.RefuseMemory <= 0 {
		cfg.RefuseMemory = time.Minute
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	return cfg
}

// Key names a growth in flight.
type Key struct {
	Overlay, Bridge string
	Fam             int
}

// Growth is one growth in flight; done closes when it ends with err.
type Growth struct {
	done chan struct{}
	err  error
	// asked says, while it runs, what it asked and was answered so far
	// (under the table's lock): an ADD whose wait ends first says it.
	asked []string
}

// Table is the overlay table growth works on (the IPAM).
type Table interface {
	// AddGrownBlock makes a block the masters leased a block of the
	// bridge, persisted before it returns.
	AddGrownBlock(k Key, lb LeasedBlock) error
	// Ask asks peers for space for the bridge (package spaceask); note,
	// when set, keeps what it asked so far.
	Ask(ctx context.Context, k Key, note func(string)) error
	// RequestID is a new request id for the masters.
	RequestID() string
	// Grown is told how a growth ended; the caller holds the table's lock.
	Grown(k Key, err error)
	// Go runs f in a goroutine the table owns (its ctx ends when the table
	// stops), or returns why it cannot (the table is stopping).
	Go(f func(ctx context.Context)) error
}

// Metrics are the counters growth counts in.
type Metrics struct {
	Grows   *prometheus.CounterVec // by path and result
	Refused *prometheus.CounterVec // by reason
}

// Runner is the growths in flight, under the table's lock.
type Runner struct {
	cfg      Config
	mu       *sync.Mutex // the table's lock
	table    Table
	log      *slog.Logger
	metrics  Metrics
	inflight map[Key]*Growth
}

// NewRunner is a runner of cfg (its defaults filled in by the caller) on
// table, whose lock is mu.
func NewRunner(cfg Config, mu *sync.Mutex, table Table, log *slog.Logger, m Metrics) *Runner {
	return &Runner{cfg: cfg, mu: mu, table: table, log: log, metrics: m, inflight: map[Key]*Growth{}}
}

// growTimeout bounds one growth (the masters, then a few peers).
const growTimeout = 30 * time.Second

// Wait waits for the growths until they end or ctx does, and returns
// their errors; one that is still in flight when ctx ends counts as
// ErrStillGrowing, with what it asked so far.
func (r *Runner) Wait(ctx context.Context, gs []*Growth) []error {
	var errs []error
	var asking []string
	growing := false
	for _, g := range gs {
		select {
		case <-g.done:
		case <-ctx.Done():
		}
		select {
		case <-g.done:
			if g.err != nil {
				errs = append(errs, g.err)
			}
		default:
			growing = true
			r.mu.Lock()
			asking = append(asking, g.asked...)
			r.mu.Unlock()
		}
	}
	if growing {
		so := "no master or peer has granted a block yet"
		if len(asking) > 0 {
			so += ": " + strings.Join(asking, "; ")
		}
		errs = append(errs, fmt.Errorf("%w (%s): try again", ErrStillGrowing, so))
	}
	return errs
}

// LowWater is the low-water mark of a bridge whose first block is first.
func (r *Runner) LowWater(first netip.Prefix) uint64 {
	if lw := r.cfg.LowWater; lw != 0 {
		return uint64(max(lw, 0))
	}
	hostBits := first.Addr().BitLen() - first.Bits()
	if hostBits >= 63 {
		return 1 << 60
	}
	return max(2, (uint64(1)<<hostBits)/8)
}

// Start returns the growth in flight for k, else starts one when free is
// below lowWater; nil when neither. The caller holds the table's lock.
func (r *Runner) Start(k Key, free, lowWater uint64) *Growth {
	if g := r.inflight[k]; g != nil {
		return g
	}
	if free >= lowWater {
		return nil
	}
	g := &Growth{done: make(chan struct{})}
	if err := r.table.Go(func(ctx context.Context) { r.run(ctx, k, g) }); err != nil {
		// Stopping: no growth starts, and the ADD that would wait
		// for one is told why.
		g.err = err
		close(g.done)
		return g
	}
	r.inflight[k] = g
	return g
}

// Growing says whether a family of an overlay has a growth in flight. The
// caller holds the table's lock.
func (r *Runner) Growing(overlay string, fam int) bool {
	for k := range r.inflight {
		if k.Overlay == overlay && k.Fam == fam {
			return true
		}
	}
	return false
}

// InFlight is the number of growths in flight. The caller holds the
// table's lock.
func (r *Runner) InFlight() int { return len(r.inflight) }

// run is one growth, in a goroutine of the table: ctx ends when the table
// stops.
func (r *Runner) run(ctx context.Context, k Key, g *Growth) {
	ctx, cancel := context.WithTimeout(ctx, growTimeout)
	defer cancel()
	err := r.once(ctx, k, g)
	if err != nil {
		r.log.Warn("a bridge could not grow", "overlay", k.Overlay, "bridge", k.Bridge, "family", ipfamily.Name(k.Fam), "err", err)
	}
	r.mu.Lock()
	delete(r.inflight, k)
	r.table.Grown(k, err)
	g.err = err
	close(g.done)
	r.mu.Unlock()
	if err == nil {
		r.Changed()
	}
}

// Changed tells the agent that blocks or rings changed.
func (r *Runner) Changed() {
	if f := r.cfg.OnChange; f != nil {
		f()
	}
}

// once gets one block: from the masters, else from a peer. g, when set,
// keeps what it asked so far.
func (r *Runner) once(ctx context.Context, k Key, g *Growth) error {
	if src := r.cfg.Source; src != nil {
		lb, err := src.Grow(ctx, k.Overlay, k.Bridge, ipfamily.Number(k.Fam), r.table.RequestID())
		switch {
		case err == nil:
			if err = r.table.AddGrownBlock(k, lb); err == nil {
				r.metrics.Grows.WithLabelValues("master", "ok").Inc()
				return nil
			}
			r.metrics.Grows.WithLabelValues("master", "error").Inc()
			r.log.Error("the masters' block could not be used", "overlay", k.Overlay, "block", lb.Prefix, "err", err)
		case errors.Is(err, ErrMastersExhausted):
			r.metrics.Grows.WithLabelValues("master", "exhausted").Inc()
			r.metrics.Refused.WithLabelValues("masters_exhausted").Inc()
		case errors.Is(err, ErrQuota):
			r.metrics.Grows.WithLabelValues("master", "quota").Inc()
			r.metrics.Refused.WithLabelValues("quota").Inc()
			return err
		case ctx.Err() != nil:
			return fmt.Errorf("growth stopped: %w", err) // the service stops, or the growth ran out of time
		default:
			r.metrics.Grows.WithLabelValues("master", "unreachable").Inc()
			r.log.Warn("no master answered a grow request: asking a peer", "overlay", k.Overlay, "err", err)
		}
	}
	var note func(string)
	if g != nil {
		note = func(asked string) {
			r.mu.Lock()
			g.asked = append(g.asked, asked)
			r.mu.Unlock()
		}
	}
	return r.table.Ask(ctx, k, note)
}
