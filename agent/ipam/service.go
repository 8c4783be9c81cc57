// Package ipam is an agent's container address service: it hands out
// container addresses from the ranges the agent owns in each overlay's ring
// (package ring), seeded from the masters' leases and gossiped to the other
// agents, persists every allocation in the agent's bbolt store before
// answering (group commit: concurrent changes share one transaction and one
// fsync), and serves the unix-socket API that carve-ipam and the Docker
// plugin use.
//
// It knows nothing of the agent: the agent hands it a View of what it
// learned (its own record, every peer's leases, the tombstones) with Sync.
//
// It keeps the overlay table and its lock, and every change to it; the
// jobs beneath it are its parts, none of which imports it: an overlay's
// address space and its sync from the masters' records and the ring
// (overlayspace), the store's record formats (ipamstore), the group commit (groupcommit), growth and
// the donor's side of it (growth), the rings' gossip (ringgossip), asking
// peers for space (spaceask), the claim keys (claimkeys), the reports to
// the masters (masterreport), the capacity gauges (capacity), the
// reclaims' memory (reclaimwatch), the unix-socket API (ipamsock), the
// requests' checks (ipamvalidate), the metrics (ipammetrics), the blocks'
// arithmetic (blockaddr) and the families' names (ipfamily).
package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/capacity"
	"github.com/carve-net/carve/agent/ipam/claimkeys"
	"github.com/carve-net/carve/agent/ipam/groupcommit"
	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/ipammetrics"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/masterreport"
	"github.com/carve-net/carve/agent/ipam/ringgossip"
	"github.com/carve-net/carve/agent/ipam/spaceask"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/goroutines"
	"github.com/carve-net/carve/ring"
)

// defaultMTU is DESIGN.md's overlay_mtu, until the network configuration says.
const defaultMTU = 1420

// Service serves container addresses out of the ranges this agent owns.
type Service struct {
	id          string
	db          *bolt.DB
	dbPath      string // db's file, for errors
	cniCacheDir string
	log         *slog.Logger
	metrics     *ipammetrics.Metrics

	mu        sync.Mutex // the state below; never held across an fsync of a request
	synced    bool       // a View arrived
	view      View
	mtu       int
	clusterID string
	// staleRings: the rings on disk belong to another cluster (forgetting
	// them failed); they are never read back.
	staleRings bool
	overlays   map[string]*overlay
	// persist holds the allocations loaded from disk that no overlay has
	// claimed yet (its overlay is not served, or the ring does not give the
	// address to this agent).
	persist map[string]map[ring.Attachment]allocRecord
	// commits is the group commit of the changes decided under s.mu
	// (commit.go); its own lock is taken before s.mu, never after.
	commits *groupcommit.Queue[write]
	channel gossip.Channel // ring gossip; nil until UseChannel
	// savedBlocks are the persisted blocks of overlays not created yet.
	savedBlocks map[string][]*heldBlock
	// expectedGrants are the grants this agent asked for and whose donor's
	// statement it verified, by overlay, while their rings are merged: the
	// only ranges beyond the masters' records it may adopt (mayAdopt).
	expectedGrants map[string][]netip.Prefix
	grow           growState
	grower         *growth.Runner // the growths in flight, under s.mu
	donor          *growth.Donor  // answers peers' space requests
	reclaim        reclaimState
	// asker, capacity and gossip keep their state under their own locks,
	// taken after s.mu, never the other way; reports is Run's alone.
	asker    *spaceask.Asker        // asks peers for space (growth through the ring)
	reports  *masterreport.Reporter // the outbox and usage reports to the masters
	capacity *capacity.Tracker      // the capacity gauges and the low-space WARN
	gossip   *ringgossip.Gossip     // the served rings' gossip
	// dirtyRings changed by other agents' entries only since they were
	// written; Run writes them every ringPersistEvery.
	dirtyRings map[ringID]bool
	// released are the attachments whose cached CNI result must not be
	// reclaimed: their DEL may still be finishing (see released.go).
	released recentReleases
	// claims are this agent's claim key and the peers', from the view's
	// records (claims.go), under s.mu.
	claims *claimkeys.Keys
	// onForget is Config.ForgetNeighbour.
	onForget func(bridge string, addr netip.Addr)

	// bg owns the goroutines the service starts on its own (growths,
	// donations): Close, and Run as it returns, cancel and wait for them,
	// so none of them uses the store after its owner closes it.
	bg *goroutines.Group

	// inTransaction, when set (tests), runs in every transaction after its
	// writes; its error fails the transaction, which bbolt rolls back.
	inTransaction func() error
}

// New opens the IPAM on the agent's store: it loads the persisted
// allocations, which are claimed back as their overlays are synced.
func New(cfg Config) (*Service, error) {
	if err := api.ValidateAgentID(cfg.AgentID); err != nil {
		return nil, fmt.Errorf("ipam: %w", err)
	}
	if cfg.DB == nil {
		return nil, errors.New("ipam: no store (Config.DB)")
	}
	if err := claimkeys.Valid(cfg.ClaimKey); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m, err := ipammetrics.New(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	st, err := load(cfg.DB)
	if err != nil {
		return nil, err
	}
	s := &Service{
		id: cfg.AgentID, db: cfg.DB, dbPath: cfg.DB.Path(), cniCacheDir: cfg.CNICacheDir, log: cfg.Logger.With("component", "ipam"), metrics: m,
		mtu: defaultMTU, clusterID: st.clusterID, overlays: map[string]*overlay{}, persist: st.allocations,
		savedBlocks: st.blocks, onForget: cfg.ForgetNeighbour,
		dirtyRings: map[ringID]bool{}, expectedGrants: map[string][]netip.Prefix{},
		bg: goroutines.New(context.Background()),
	}
	s.commits = groupcommit.New(&s.mu, s.writeBatch)
	s.gossip = ringgossip.New(ringgossip.Config{Self: s.id, Rings: (*ringOwner)(s), Log: s.log, Results: m.RingGossip, OnSent: cfg.OnSent})
	s.claims = claimkeys.New(s.id, cfg.ClaimKey, s.tombstoned)
	s.grow = newGrowState(cfg.Growth)
	s.donor = growth.NewDonor((*donorTable)(s), s.log, growth.DonorMetrics{RingGossip: m.RingGossip, ClaimsRefused: m.ClaimsRefused, GrantsGiven: m.GrantsGiven}, s.changed)
	s.grower = growth.NewRunner(s.grow.cfg, &s.mu, (*growTable)(s), s.log, growth.Metrics{Grows: m.Grows, Refused: m.Refused})
	s.asker = spaceask.New(spaceask.Config{Self: s.id, Host: (*askHost)(s), Seed: s.grow.cfg.Seed, AnswerTimeout: s.grow.cfg.AnswerTimeout,
		RefuseMemory: s.grow.cfg.RefuseMemory, Grows: m.Grows, Refused: m.Refused})
	s.reports = s.newReporter()
	s.capacity = capacity.New(s.readCapacity, s.log)
	s.released.load(st.released)
	s.reclaim = newReclaimState(cfg.Reclaim)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.capacity); err != nil {
			return nil, fmt.Errorf("ipam: register metrics: %w", err)
		}
	}
	s.grow.granted = st.granted
	s.grow.returned = st.returned
	n := 0
	for _, m := range s.persist {
		n += len(m)
	}
	if n > 0 {
		s.log.Info("loaded allocations", "count", n, "cluster_id", s.clusterID)
	}
	return s, nil
}

// errStopping answers what would need a goroutine of a service that is
// stopping (Close, or Run returned).
var errStopping = errors.New("the agent's IPAM is stopping: try again when it is back")

// Close stops the service's background work: it cancels the growths and
// donations in flight and returns once they have ended; afterwards none
// starts. Run does the same as it returns. The caller closes the store
// only after Close (or Run) returned. Requests still answered afterwards
// (Allocate, Release) work without growing.
func (s *Service) Close() {
	s.bg.Stop()
}

// UseChannel gives the IPAM the ring channel (RingChannel) to broadcast its
// changed rings on.
func (s *Service) UseChannel(ch gossip.Channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.channel = ch
}

// Sync brings the overlays' allocators in line with the view (kept: the
// caller changes none of it afterwards): served overlays get an allocator
// seeded from everyone's leases, persisted allocations are claimed back
// before any new one is made, overlays that are no longer OK here stop
// taking allocations, and what this agent changed in its rings is
// broadcast (not the masters' leases: every agent seeds those). A view of
// another cluster than the rings' rebuilds first.
func (s *Service) Sync(v View) {
	s.sync(v)
	s.gossip.Announce()
}

// sync holds both locks across its one commit: it reshapes the state, and
// runs only when the agent's view changes and on its periodic resync.
func (s *Service) sync(v View) {
	s.commits.Quiesce()
	defer s.commits.Release()
	defer s.mu.Unlock()
	b := groupcommit.NewBatch[write]()
	switch {
	case v.ClusterID == "" || v.ClusterID == s.clusterID:
	case s.clusterID == "":
		// The first cluster id this agent learns: its rings are that cluster's.
		s.clusterID = v.ClusterID
		b.Add(change{Writes: []write{ipamstore.PutClusterID(v.ClusterID)}})
	default:
		s.log.Warn("the masters' cluster changed: forgetting every ring", "was", s.clusterID, "now", v.ClusterID)
		s.rebuildLocked(v.ClusterID)
	}
	s.synced, s.view = true, v
	s.learnClaimKeys(v)
	s.mtu = defaultMTU
	if v.Network != nil && v.Network.OverlayMTU > 0 {
		s.mtu = v.Network.OverlayMTU
	}
	if s.staleRings {
		s.forgetRings()
	}
	s.syncOverlays(v, b)
	s.pruneGranted(v, b)
	_ = s.commits.CommitQuiesced(b) // a failure took the changes back, and was logged
}

// pruneGranted forgets the space requests this agent granted whose block
// the masters' record of the recipient now lists (the recipient had the
// answer: it reported the grant, and repeats the request no more), and
// those of deleted recipients; the caller holds s.mu.
func (s *Service) pruneGranted(v View, b *batch) {
	if len(s.grow.granted) == 0 {
		return
	}
	recorded := map[[2]string]bool{} // (agent, block) in the view
	for _, p := range v.Peers {
		for _, sub := range p.Subnets {
			recorded[[2]string{p.ID, sub}] = true
		}
	}
	deleted := map[string]bool{}
	for _, t := range v.Tombstones {
		deleted[t.AgentID] = true
	}
	for key, p := range s.grow.granted {
		if deleted[key[0]] || recorded[[2]string{key[0], p.String()}] {
			delete(s.grow.granted, key)
			b.Add(change{Writes: []write{ipamstore.DeleteGranted(key[0], key[1])}})
		}
	}
}

// Rebuild forgets every ring, in memory and on disk, because the masters'
// cluster was rebuilt (clusterID is the new one): the old rings' leases
// carry Raft indexes of a log that no longer exists and would beat the new
// leases. The allocations are kept, and claimed back by the next Sync where
// the new leases give their addresses to this agent.
func (s *Service) Rebuild(clusterID string) {
	s.commits.Quiesce()
	defer s.commits.Release()
	defer s.mu.Unlock()
	s.log.Warn("the masters' cluster was rebuilt: forgetting every ring", "was", s.clusterID, "now", clusterID)
	s.rebuildLocked(clusterID)
}

// rebuildLocked is Rebuild under quiesce.
func (s *Service) rebuildLocked(clusterID string) {
	for _, o := range s.overlays {
		s.retire(o)
	}
	s.clusterID = clusterID
	s.forgetRings()
}

// forgetRings deletes the persisted rings; until it succeeds (Sync tries
// again) no ring is read back from disk. The caller holds s.mu.
func (s *Service) forgetRings() {
	if err := ipamstore.ForgetRings(s.db, s.clusterID); err != nil {
		s.log.Error("forget the persisted rings of the old cluster", "err", err)
		s.staleRings = true
		return
	}
	s.staleRings = false
}

// Networks names the overlays this agent serves (allocations on one whose
// ring refused the masters' leases fail until it is fixed).
func (s *Service) Networks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, name := range sortedKeys(s.overlays) {
		if s.overlays[name].Unserved == "" {
			out = append(out, name)
		}
	}
	return out
}
