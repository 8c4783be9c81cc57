// Package state is the masters' replicated lease table and the rules that
// change it: the Raft state machine (LeaseTable) that applies the commands
// of the log (master/logcmd), who may hold which block (the allocators over
// prefixspace, leases, growth, grants, returns, quarantine, quotas),
// snapshots and restores, what each index changed and the tombstone
// compaction, revocations, and the cached, signed encoding of the state as
// the API shows it. It has no HTTP and no network: package master serves
// it and replicates it with raftlog.
//
// What the table consumes but does not decide lives in packages of their
// own that never import this one: the log's commands, made from validated
// requests, and their decoding (master/logcmd), the snapshot format
// (master/snapshot), the bounded change log (master/changelog), the deny
// list of certificates (master/denylist), the network configuration
// (master/netconfig), an agent's record and its rendering (master/record),
// the signer (master/recordsign), what agents tell the leader outside the
// log (master/usage) and the judgement of their trust reports
// (master/agenttrust); cmd/carve/deps_test.go keeps them so.
package state

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/master/denylist"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/record"
	"github.com/carve-net/carve/master/recordsign"
	"github.com/carve-net/carve/master/usage"
	"github.com/carve-net/carve/raftlog"
)

// Errors that applying a command can give; the HTTP layer maps them to codes.
var (
	// ErrVTEPExhausted: no VTEP IP is left for a new agent.
	ErrVTEPExhausted = errors.New("no free VTEP IP left")
	// ErrNoConfig: the network configuration is not yet in the log.
	ErrNoConfig = errors.New("the network configuration is not committed yet")
	// ErrUnknownAgent: no agent by that id or IP.
	ErrUnknownAgent = errors.New("unknown agent")
	// ErrBadCommand: a log entry that cannot be decoded (never written by
	// us), logcmd's.
	ErrBadCommand = logcmd.ErrBadCommand
	// ErrRequestIDReused: a request id already named another request (another
	// command, or the same command with another body).
	ErrRequestIDReused = errors.New("request_id already used by another request")
	// ErrReportAhead: an agent reported on a version of its record that the
	// masters have not written.
	ErrReportAhead = errors.New("report on a record version the masters have not written")
	// ErrStatementUsed: a donor's signed grant statement already moved
	// space once.
	ErrStatementUsed = errors.New("grant statement already used")
	// ErrKeyInUse: a registration carries a public key (WireGuard or claim)
	// that another agent's record holds: keys are their holder's.
	ErrKeyInUse = errors.New("key already registered by another agent")
)

// LeaseTable is the replicated state of the masters: the cluster id, the
// network configuration, every agent's leases, tombstones of deleted agents,
// the outcomes of recent requests and the masters' HTTP addresses. It is the
// Raft state machine: Apply is deterministic, and every change carries the
// Raft index that applied it.
type LeaseTable struct {
	mu         sync.RWMutex
	index      uint64 // last applied Raft index
	stateIndex uint64 // index of the last change visible in State
	clusterID  string
	net        *network
	agents     map[string]*agentRecord
	byIP       map[netip.Addr]string
	byKey      map[string]keySet // the agents that registered each key (keys.go)
	tombstones map[string]uint64
	servers    map[string]ServerMeta
	requests   requestTable

	vteps  *slicePool
	vteps6 *slicePool // nil without vtep_subnet6
	spaces map[string]*overlaySpace
	// quarantine holds, by overlay, the space of deleted agents that is
	// not leasable yet (see applyRelease); replicated.
	quarantine map[string][]quarantined
	// usage is what agents last reported of their blocks (not replicated).
	usage *usage.Table
	// reports are the agents' last configuration reports, by agent id.
	reports map[string]agentReport

	// changes is the log of what each state index changed (changes.go);
	// touched and touchedAll collect it while a command applies.
	changes    changelog.Log
	touched    []string
	touchedAll bool
	// horizon is the highest index tombstones were compacted up to; marks
	// tie indexes to the leader's clock for the next compaction.
	horizon uint64
	marks   []clockMark
	// changeLogIDs bounds changes (changelog.DefaultIDs; tests lower it).
	changeLogIDs int

	// changed is closed and replaced whenever stateIndex moves (watchers).
	changed chan struct{}
	cache   stateCache
	// denied is the deny list of certificates (revocation.go); reset
	// empties it and keeps its signal (not replicated).
	denied *denylist.List

	// signer signs what the API shows (nil: nothing is signed); not part of
	// the replicated state, so reset leaves it.
	signer *recordsign.Signer
	// signingGen counts SetSigning calls (SigningGeneration).
	signingGen uint64
	// restore is the last restore from a snapshot (restore.go); nil when
	// the table never was. Never changed in place.
	restore *api.Restore
	// history names the Raft log this table was applied from: set by a
	// restore into a table of no cluster (a whole-cluster restore, which
	// starts a new log); "" means the cluster id names it (restore.go).
	history string
	// digests are the recent digests of the replicated state (digest.go).
	digests digestBook
	// usedStatements are the donors' signed grant statements that moved
	// space, by StatementID, with their expiry (Unix seconds): a statement
	// is used once, across request-id roll-over and restores (kept like
	// revocations), until it expires and no longer verifies anyway.
	usedStatements map[string]int64
}

var _ raftlog.StateMachine = (*LeaseTable)(nil)

// ServerMeta is a master's addresses as the log records them.
type ServerMeta = logcmd.ServerMeta

// NewLeaseTable returns an empty table (no configuration yet).
func NewLeaseTable() *LeaseTable {
	t := &LeaseTable{changed: make(chan struct{}), changeLogIDs: changelog.DefaultIDs, usage: usage.New(), denied: denylist.New()}
	t.reset()
	return t
}

func (t *LeaseTable) reset() {
	t.index, t.stateIndex, t.clusterID, t.net = 0, 0, "", nil
	t.agents = map[string]*agentRecord{}
	t.byIP = map[netip.Addr]string{}
	t.byKey = map[string]keySet{}
	t.tombstones = map[string]uint64{}
	t.servers = map[string]ServerMeta{}
	t.requests = newRequestTable()
	t.vteps, t.vteps6 = nil, nil
	t.spaces = map[string]*overlaySpace{}
	t.quarantine = map[string][]quarantined{}
	t.reports = map[string]agentReport{}
	t.cache = newStateCache()
	t.changes = changelog.New(t.changeLogIDs)
	t.touched, t.touchedAll, t.horizon, t.marks = nil, false, 0, nil
	t.usedStatements = map[string]int64{}
	t.denied.Reset()
	t.restore, t.history = nil, ""
}

// notifyChanged wakes the watchers; the caller holds t.mu for writing.
func (t *LeaseTable) notifyChanged() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// WouldChange reports whether registering req must go through the log; when
// it need not (nothing would change), it returns the agent's current record,
// so the registration can be answered without a log entry. A request id
// already known always goes through the log, which answers a retry with the
// request's own outcome and refuses a reused id.
func (t *LeaseTable) WouldChange(req api.RegisterRequest) (*api.AgentInfo, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.net == nil {
		return nil, true
	}
	if req.RequestID != "" && t.requests.known(req.RequestID) {
		return nil, true
	}
	rec := t.agents[req.AgentID]
	ip, err := netip.ParseAddr(req.IP)
	if rec == nil || err != nil {
		return nil, true
	}
	if rec.Hostname != req.Hostname || rec.IP != ip || rec.MeshAddr != req.MeshAddr || rec.Bridges != req.NetworkConfig ||
		rec.Keys != req.Keys || rec.UnderlayMTU != req.UnderlayMTU || rec.CarveVersion != req.CarveVersion {
		return nil, true
	}
	if t.vteps6 != nil && !rec.VTEP6.IsValid() {
		return nil, true
	}
	for def := range t.net.Overlays() {
		if !def.Enabled() {
			continue
		}
		l, ok := rec.Leases[def.Name()]
		if !ok || l.Failed != "" || (def.Subnet().IsValid() && !l.Subnet.IsValid()) || (def.Subnet6().IsValid() && !l.Subnet6.IsValid()) {
			return nil, true
		}
	}
	return t.render(rec), false
}

// ReportWouldChange reports whether an agent's configuration report must go
// through the log; when it need not (the masters hold that very report),
// it returns the agent's current record. A known request id always goes
// through the log.
func (t *LeaseTable) ReportWouldChange(agentID string, req api.ReportRequest) (*api.AgentInfo, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if req.RequestID != "" && t.requests.known(req.RequestID) {
		return nil, true
	}
	rec := t.agents[agentID]
	old, ok := t.reports[agentID]
	rep, err := record.ReportOf(req)
	if rec == nil || !ok || err != nil || !old.Equal(rep) {
		return nil, true
	}
	return t.render(rec), false
}

// Index returns the index of the last change visible in the state.
func (t *LeaseTable) Index() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.stateIndex
}

// AppliedIndex returns the last Raft index applied.
func (t *LeaseTable) AppliedIndex() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.index
}

// Changed returns a channel closed at the next change of the state, and the
// state index it is relative to.
func (t *LeaseTable) Changed() (<-chan struct{}, uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.changed, t.stateIndex
}

// ClusterID returns the id the cluster's first leader committed, or "" while
// none is committed.
func (t *LeaseTable) ClusterID() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.clusterID
}

// Network returns the committed network configuration, and false when none is committed.
func (t *LeaseTable) Network() (api.NetworkConfig, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.net == nil {
		return api.NetworkConfig{}, false
	}
	return t.net.Config(), true
}

// ConfigChange tells whether proposing cfg would change the committed
// configuration, and the warnings merging it gives.
func (t *LeaseTable) ConfigChange(cfg api.NetworkConfig) (bool, []string, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	merged, warnings, err := t.mergeConfig(cfg)
	if err != nil {
		return false, warnings, err
	}
	return t.net == nil || !netconfig.Equal(t.net.Config(), merged.Config()), warnings, nil
}

// Server returns the recorded addresses of a master.
func (t *LeaseTable) Server(id string) (ServerMeta, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.servers[id]
	return s, ok
}

// Agent returns one agent's record, or false.
func (t *LeaseTable) Agent(id string) (*api.AgentInfo, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	rec := t.agents[id]
	if rec == nil {
		return nil, false
	}
	info := t.render(rec)
	t.usage.Fill(info, rec.Created)
	return info, true
}

// Tombstone returns the index at which an agent was deleted.
func (t *LeaseTable) Tombstone(id string) (uint64, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	v, ok := t.tombstones[id]
	return v, ok
}

// DeletedClaimKey returns the claim key a deleted agent held, as kept with
// its quarantined space in an overlay that contains prefix; ok is false
// when no such space is quarantined, and the key is empty when it was
// quarantined before keys were kept.
func (t *LeaseTable) DeletedClaimKey(overlay, donor string, prefix netip.Prefix) (key string, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, q := range t.quarantine[overlay] {
		if q.From == donor && q.Prefix.Overlaps(prefix) {
			return q.ClaimKey, true
		}
	}
	return "", false
}

// AgentCount is the number of agents in the table.
func (t *LeaseTable) AgentCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.agents)
}

// State returns the whole state as the API shows it.
func (t *LeaseTable) State() api.State {
	t.mu.RLock()
	defer t.mu.RUnlock()
	st := api.State{Index: t.stateIndex, ClusterID: t.clusterID, SigningKey: t.signer.PublicKey(), Horizon: t.horizon,
		SigningChain: t.signer.SigningChain()}
	if t.net != nil {
		st.Network = t.net.Config()
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		info := t.render(t.agents[id])
		t.signer.SignAgent(info, t.clusterID)
		t.usage.Fill(info, t.agents[id].Created)
		st.Agents = append(st.Agents, *info)
	}
	for _, id := range slices.Sorted(maps.Keys(t.tombstones)) {
		tb := api.Tombstone{AgentID: id, Version: t.tombstones[id]}
		t.signer.SignTombstone(&tb, t.clusterID)
		st.Tombstones = append(st.Tombstones, tb)
	}
	st.Quarantine = t.quarantineAPI()
	st.Revoked = t.denied.Sorted()
	return st
}

// quarantineAPI is the quarantine as the state shows it, sorted by
// overlay and address; the caller holds t.mu.
func (t *LeaseTable) quarantineAPI() []api.QuarantinedBlock {
	var out []api.QuarantinedBlock
	for _, name := range slices.Sorted(maps.Keys(t.quarantine)) {
		qs := slices.Clone(t.quarantine[name])
		slices.SortFunc(qs, func(a, b quarantined) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
		for _, q := range qs {
			out = append(out, api.QuarantinedBlock{Overlay: name, Prefix: q.Prefix.String(), From: q.From, Since: q.Since})
		}
	}
	return out
}
