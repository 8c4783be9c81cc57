package master

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/carve-net/carve/api"
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
	// ErrBadCommand: a log entry that cannot be decoded (never written by us).
	ErrBadCommand = errors.New("undecodable command")
)

// maxRequestIDs is how many recent request ids are remembered so that a
// retry after an unknown outcome has one effect. Pruned first in, first out,
// which is deterministic on every replica.
const maxRequestIDs = 100_000

// snapshotFormat is the version of the snapshot encoding.
const snapshotFormat = 1

// agentRecord is one agent's committed record. Records are immutable once
// stored (copy on write), so snapshots and readers share them freely.
type agentRecord struct {
	ID       string
	Hostname string
	IP       netip.Addr // invalid when another agent took the IP
	MeshAddr string
	Bridges  api.AgentNetworkConfig
	VTEP     netip.Addr
	Leases   map[string]overlayLease // by overlay name
	Version  uint64
}

// overlayLease is an agent's share of one overlay.
type overlayLease struct {
	Subnet  netip.Prefix `json:"subnet,omitzero"`
	Subnet6 netip.Prefix `json:"subnet6,omitzero"`
	// Failed says why the overlay (or its IPv6 part) was left out.
	Failed string `json:"failed,omitempty"`
}

func (r *agentRecord) clone() *agentRecord {
	c := *r
	c.Leases = maps.Clone(r.Leases)
	if c.Leases == nil {
		c.Leases = map[string]overlayLease{}
	}
	return &c
}

func (r *agentRecord) equal(o *agentRecord) bool {
	return r.ID == o.ID && r.Hostname == o.Hostname && r.IP == o.IP && r.MeshAddr == o.MeshAddr &&
		r.Bridges == o.Bridges && r.VTEP == o.VTEP && maps.Equal(r.Leases, o.Leases)
}

// overlayPools are the allocators of one overlay.
type overlayPools struct {
	v4, v6 *slicePool
}

// LeaseTable is the replicated state of the masters: the network
// configuration, every agent's leases, tombstones of deleted agents, and the
// masters' HTTP addresses. It is the Raft state machine: Apply is
// deterministic, and every change carries the Raft index that applied it.
type LeaseTable struct {
	mu         sync.RWMutex
	index      uint64 // last applied Raft index
	stateIndex uint64 // index of the last change visible in State
	net        *network
	agents     map[string]*agentRecord
	byIP       map[netip.Addr]string
	tombstones map[string]uint64
	servers    map[string]serverMeta
	requests   map[string]uint64
	requestLog []string // FIFO of request ids for pruning

	vteps *slicePool
	pools map[string]*overlayPools

	// changed is closed and replaced whenever stateIndex moves (watchers).
	changed chan struct{}
	cache   stateCache
}

// NewLeaseTable returns an empty table (no configuration yet).
func NewLeaseTable() *LeaseTable {
	t := &LeaseTable{changed: make(chan struct{})}
	t.reset()
	return t
}

func (t *LeaseTable) reset() {
	t.index, t.stateIndex, t.net = 0, 0, nil
	t.agents = map[string]*agentRecord{}
	t.byIP = map[netip.Addr]string{}
	t.tombstones = map[string]uint64{}
	t.servers = map[string]serverMeta{}
	t.requests = map[string]uint64{}
	t.requestLog = nil
	t.vteps = nil
	t.pools = map[string]*overlayPools{}
	t.cache = stateCache{agents: map[string]cachedAgent{}}
}

var _ raftlog.StateMachine = (*LeaseTable)(nil)

// Apply applies one command at a Raft index (raftlog.StateMachine).
func (t *LeaseTable) Apply(index uint64, data []byte) any {
	var c command
	if err := json.Unmarshal(data, &c); err != nil {
		return applyResult{Err: fmt.Errorf("%w: %v", ErrBadCommand, err)}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if index > t.index {
		t.index = index
	}
	before := t.stateIndex
	var res applyResult
	if c.RequestID != "" {
		if _, dup := t.requests[c.RequestID]; dup {
			return t.duplicateResult(c)
		}
	}
	switch c.Op {
	case opRegister:
		if c.Register == nil {
			return applyResult{Err: fmt.Errorf("%w: register without body", ErrBadCommand)}
		}
		res = t.applyRegister(index, c.Register)
	case opDelete:
		if c.Delete == nil {
			return applyResult{Err: fmt.Errorf("%w: delete without body", ErrBadCommand)}
		}
		res = t.applyDelete(index, c.Delete)
	case opSetConfig:
		if c.SetConfig == nil {
			return applyResult{Err: fmt.Errorf("%w: set_config without body", ErrBadCommand)}
		}
		res = t.applySetConfig(index, *c.SetConfig)
	case opServerMeta:
		if c.ServerMeta == nil {
			return applyResult{Err: fmt.Errorf("%w: server_meta without body", ErrBadCommand)}
		}
		t.servers[c.ServerMeta.ID] = *c.ServerMeta
	default:
		return applyResult{Err: fmt.Errorf("%w: unknown op %q", ErrBadCommand, c.Op)}
	}
	if c.RequestID != "" && res.Err == nil {
		t.rememberRequest(c.RequestID, index)
	}
	if t.stateIndex != before {
		close(t.changed)
		t.changed = make(chan struct{})
	}
	return res
}

// duplicateResult answers a retried command that was already applied: the
// effect happened once; the answer describes the current state.
func (t *LeaseTable) duplicateResult(c command) applyResult {
	switch c.Op {
	case opRegister:
		rec := t.agents[c.Register.AgentID]
		if rec == nil {
			return applyResult{Err: fmt.Errorf("%w: %s was deleted after it registered", ErrUnknownAgent, c.Register.AgentID)}
		}
		return applyResult{Agent: t.render(rec)}
	case opDelete:
		return applyResult{Deleted: c.Delete.Agents}
	}
	return applyResult{}
}

func (t *LeaseTable) rememberRequest(id string, index uint64) {
	t.requests[id] = index
	t.requestLog = append(t.requestLog, id)
	if len(t.requestLog) > maxRequestIDs {
		drop := len(t.requestLog) - maxRequestIDs
		for _, old := range t.requestLog[:drop] {
			delete(t.requests, old)
		}
		t.requestLog = slices.Clone(t.requestLog[drop:])
	}
}

func (t *LeaseTable) applyRegister(index uint64, c *registerCmd) applyResult {
	if t.net == nil {
		return applyResult{Err: ErrNoConfig}
	}
	ip, err := netip.ParseAddr(c.IP)
	if err != nil {
		return applyResult{Err: fmt.Errorf("%w: ip %q", ErrBadCommand, c.IP)}
	}
	old := t.agents[c.AgentID]
	var rec *agentRecord
	if old == nil {
		rec = &agentRecord{ID: c.AgentID, Leases: map[string]overlayLease{}}
		n, ok := t.vteps.allocate(c.AgentID)
		if !ok {
			return applyResult{Err: fmt.Errorf("%w in vtep_subnet %s", ErrVTEPExhausted, t.net.vtepNet)}
		}
		rec.VTEP = t.vteps.addrAt(n)
	} else {
		rec = old.clone()
	}
	rec.Hostname, rec.IP, rec.MeshAddr, rec.Bridges = c.Hostname, ip, c.MeshAddr, c.Bridges
	// The newest registration takes the IP; the older record keeps its
	// leases without an IP until it registers again.
	if other, ok := t.byIP[ip]; ok && other != c.AgentID {
		o := t.agents[other].clone()
		o.IP = netip.Addr{}
		o.Version = index
		t.agents[other] = o
		t.stateIndex = index
	}
	t.ensureLeases(rec)
	if old != nil && old.equal(rec) {
		return applyResult{Agent: t.render(old)}
	}
	if old != nil && old.IP.IsValid() && old.IP != ip && t.byIP[old.IP] == c.AgentID {
		delete(t.byIP, old.IP)
	}
	t.byIP[ip] = c.AgentID
	rec.Version = index
	t.agents[c.AgentID] = rec
	delete(t.tombstones, c.AgentID)
	t.stateIndex = index
	return applyResult{Agent: t.render(rec)}
}

// ensureLeases gives rec a subnet of every enabled overlay it lacks, and
// records why when an overlay is exhausted.
func (t *LeaseTable) ensureLeases(rec *agentRecord) {
	for _, def := range t.net.overlays {
		if !def.enabled {
			continue
		}
		l := rec.Leases[def.api.Name]
		pools := t.pools[def.api.Name]
		l.Failed = ""
		var failures []string
		if def.subnet.IsValid() && !l.Subnet.IsValid() {
			if n, ok := pools.v4.allocate(rec.ID); ok {
				l.Subnet = pools.v4.prefixAt(n)
			} else {
				failures = append(failures, fmt.Sprintf("exhausted: no free /%d left in %s", def.prefix, def.subnet))
			}
		}
		if def.subnet6.IsValid() && !l.Subnet6.IsValid() {
			if n, ok := pools.v6.allocate(rec.ID); ok {
				l.Subnet6 = pools.v6.prefixAt(n)
			} else {
				failures = append(failures, fmt.Sprintf("exhausted: no free /%d left in %s", def.prefix6, def.subnet6))
			}
		}
		if len(failures) > 0 {
			l.Failed = failures[0]
			if len(failures) > 1 {
				l.Failed += "; " + failures[1]
			}
		}
		rec.Leases[def.api.Name] = l
	}
}

func (t *LeaseTable) applyDelete(index uint64, c *deleteCmd) applyResult {
	var deleted []string
	for _, name := range c.Agents {
		id := name
		if _, ok := t.agents[id]; !ok {
			if ip, err := netip.ParseAddr(name); err == nil {
				id = t.byIP[ip]
			}
		}
		rec := t.agents[id]
		if rec == nil {
			if _, gone := t.tombstones[name]; c.Strict && !gone {
				return applyResult{Err: fmt.Errorf("%w %q", ErrUnknownAgent, name)}
			}
			continue
		}
		t.freeLeases(rec)
		delete(t.agents, id)
		if rec.IP.IsValid() && t.byIP[rec.IP] == id {
			delete(t.byIP, rec.IP)
		}
		t.tombstones[id] = index
		t.stateIndex = index
		deleted = append(deleted, id)
	}
	return applyResult{Deleted: deleted}
}

func (t *LeaseTable) freeLeases(rec *agentRecord) {
	if n, ok := t.vteps.number(rec.VTEP); ok && t.vteps.used[n] == rec.ID {
		t.vteps.release(n)
	}
	for name, l := range rec.Leases {
		p := t.pools[name]
		if p == nil {
			continue
		}
		if l.Subnet.IsValid() && p.v4 != nil {
			if n, ok := p.v4.number(l.Subnet.Addr()); ok && p.v4.used[n] == rec.ID {
				p.v4.release(n)
			}
		}
		if l.Subnet6.IsValid() && p.v6 != nil {
			if n, ok := p.v6.number(l.Subnet6.Addr()); ok && p.v6.used[n] == rec.ID {
				p.v6.release(n)
			}
		}
	}
}

// applySetConfig merges a (validated) configuration into the state.
func (t *LeaseTable) applySetConfig(index uint64, cfg api.NetworkConfig) applyResult {
	merged, warnings, err := t.mergeConfig(cfg)
	if err != nil {
		return applyResult{Err: err, Warnings: warnings}
	}
	if t.net != nil && configEqual(t.net.api, merged.api) {
		return applyResult{Warnings: warnings}
	}
	t.net = merged
	t.rebuildPools()
	t.cache.agents = map[string]cachedAgent{}
	// Give existing agents their share of overlays added or enabled now;
	// sorted so every replica allocates in the same order.
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		old := t.agents[id]
		rec := old.clone()
		t.ensureLeases(rec)
		if !old.equal(rec) {
			rec.Version = index
			t.agents[id] = rec
		}
	}
	t.stateIndex = index
	return applyResult{Warnings: warnings}
}

// mergeConfig computes the configuration that results from applying cfg to
// the current state: overlays the new file drops but that hold leases stay,
// disabled; a leased overlay's subnets and the VTEP subnet in use never
// change under the agents; a new overlay that would overlap a kept one is
// left out. The problems are returned as warnings, never as an abort.
func (t *LeaseTable) mergeConfig(cfg api.NetworkConfig) (*network, []string, error) {
	cfg = WithDefaults(cfg)
	if t.net == nil {
		n, err := parseNetwork(cfg)
		return n, nil, err
	}
	var warnings []string
	leased := t.leasedOverlays()
	if cfg.VTEPSubnet != t.net.api.VTEPSubnet && len(t.agents) > 0 {
		warnings = append(warnings, fmt.Sprintf("vtep_subnet stays %s: agents hold VTEP IPs in it (the new config says %s)", t.net.api.VTEPSubnet, cfg.VTEPSubnet))
		cfg.VTEPSubnet = t.net.api.VTEPSubnet
	}
	oldDefs := map[string]overlayDef{}
	for _, d := range t.net.overlays {
		oldDefs[d.api.Name] = d
	}
	var overlays []api.OverlayNetwork
	named := map[string]bool{}
	for _, o := range cfg.Overlays {
		named[o.Name] = true
		if old, ok := oldDefs[o.Name]; ok && leased[o.Name] &&
			(o.Subnet != old.api.Subnet || o.Prefix != old.api.Prefix || o.Subnet6 != old.api.Subnet6 || o.Prefix6 != old.api.Prefix6) {
			warnings = append(warnings, fmt.Sprintf("overlay %q keeps subnet %q/%d subnet6 %q/%d: agents hold leases in it", o.Name, old.api.Subnet, old.api.Prefix, old.api.Subnet6, old.api.Prefix6))
			kept := old.api
			kept.Enabled = o.Enabled
			o = kept
		}
		overlays = append(overlays, o)
	}
	var keptDropped []api.OverlayNetwork
	for _, d := range t.net.overlays {
		if named[d.api.Name] || !leased[d.api.Name] {
			continue
		}
		kept := d.api
		kept.Enabled = new(bool)
		keptDropped = append(keptDropped, kept)
		warnings = append(warnings, fmt.Sprintf("overlay %q is no longer configured: its leases are kept, disabled", d.api.Name))
	}
	// Kept overlays win over new ones that would overlap them.
	var final []api.OverlayNetwork
	for _, o := range overlays {
		probe := cfg
		probe.Overlays = append(append([]api.OverlayNetwork{}, keptDropped...), o)
		if _, err := parseNetwork(probe); err != nil && len(keptDropped) > 0 {
			if _, alone := parseNetwork(withOverlays(cfg, o)); alone == nil {
				warnings = append(warnings, fmt.Sprintf("overlay %q left out: it overlaps an overlay whose leases are kept (%v)", o.Name, err))
				continue
			}
		}
		final = append(final, o)
	}
	cfg.Overlays = append(final, keptDropped...)
	n, err := parseNetwork(cfg)
	if err != nil {
		return nil, warnings, err
	}
	return n, warnings, nil
}

func withOverlays(cfg api.NetworkConfig, o ...api.OverlayNetwork) api.NetworkConfig {
	cfg.Overlays = o
	return cfg
}

// leasedOverlays names the overlays in which some agent holds a subnet.
func (t *LeaseTable) leasedOverlays() map[string]bool {
	out := map[string]bool{}
	for name, p := range t.pools {
		if (p.v4 != nil && len(p.v4.used) > 0) || (p.v6 != nil && len(p.v6.used) > 0) {
			out[name] = true
		}
	}
	return out
}

func configEqual(a, b api.NetworkConfig) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// rebuildPools recreates every allocator from the records (after a config
// change or a restore). Leases outside the current definitions are dropped
// from the pools but stay in the records until the agent is deleted.
func (t *LeaseTable) rebuildPools() {
	t.vteps = newHostPool(t.net.vtepNet)
	t.pools = map[string]*overlayPools{}
	for _, d := range t.net.overlays {
		p := &overlayPools{}
		if d.subnet.IsValid() {
			p.v4 = newSlicePool(d.subnet, d.prefix)
		}
		if d.subnet6.IsValid() {
			p.v6 = newSlicePool(d.subnet6, d.prefix6)
		}
		t.pools[d.api.Name] = p
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		rec := t.agents[id]
		if n, ok := t.vteps.number(rec.VTEP); ok {
			t.vteps.take(n, id)
		}
		for name, l := range rec.Leases {
			p := t.pools[name]
			if p == nil {
				continue
			}
			if p.v4 != nil && l.Subnet.IsValid() {
				if n, ok := p.v4.number(l.Subnet.Addr()); ok {
					p.v4.take(n, id)
				}
			}
			if p.v6 != nil && l.Subnet6.IsValid() {
				if n, ok := p.v6.number(l.Subnet6.Addr()); ok {
					p.v6.take(n, id)
				}
			}
		}
	}
	t.vteps.hint = t.vteps.lo
	for _, p := range t.pools {
		if p.v4 != nil {
			p.v4.hint = p.v4.lo
		}
		if p.v6 != nil {
			p.v6.hint = p.v6.lo
		}
	}
}

// WouldChange reports whether registering req would change the state; when
// it would not, it returns the agent's current record, so the registration
// can be answered without a log entry.
func (t *LeaseTable) WouldChange(req api.RegisterRequest) (*api.AgentInfo, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.net == nil {
		return nil, true
	}
	rec := t.agents[req.AgentID]
	ip, err := netip.ParseAddr(req.IP)
	if rec == nil || err != nil {
		return nil, true
	}
	if rec.Hostname != req.Hostname || rec.IP != ip || rec.MeshAddr != req.MeshAddr || rec.Bridges != req.NetworkConfig {
		return nil, true
	}
	for _, def := range t.net.overlays {
		if !def.enabled {
			continue
		}
		l, ok := rec.Leases[def.api.Name]
		if !ok || l.Failed != "" || (def.subnet.IsValid() && !l.Subnet.IsValid()) || (def.subnet6.IsValid() && !l.Subnet6.IsValid()) {
			return nil, true
		}
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

// Network returns the committed network configuration, and false when none is committed.
func (t *LeaseTable) Network() (api.NetworkConfig, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.net == nil {
		return api.NetworkConfig{}, false
	}
	return t.net.api, true
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
	return t.net == nil || !configEqual(t.net.api, merged.api), warnings, nil
}

// Server returns the recorded addresses of a master.
func (t *LeaseTable) Server(id string) (serverMeta, bool) {
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
	return t.render(rec), true
}

// Tombstone returns the index at which an agent was deleted.
func (t *LeaseTable) Tombstone(id string) (uint64, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	v, ok := t.tombstones[id]
	return v, ok
}

// State returns the whole state as the API shows it.
func (t *LeaseTable) State() api.State {
	t.mu.RLock()
	defer t.mu.RUnlock()
	st := api.State{Index: t.stateIndex}
	if t.net != nil {
		st.Network = t.net.api
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		st.Agents = append(st.Agents, *t.render(t.agents[id]))
	}
	for _, id := range slices.Sorted(maps.Keys(t.tombstones)) {
		st.Tombstones = append(st.Tombstones, api.Tombstone{AgentID: id, Version: t.tombstones[id]})
	}
	return st
}

// render turns a record into its API form; the caller holds t.mu.
func (t *LeaseTable) render(rec *agentRecord) *api.AgentInfo {
	info := &api.AgentInfo{
		AgentID:       rec.ID,
		Hostname:      rec.Hostname,
		MeshAddr:      rec.MeshAddr,
		Version:       rec.Version,
		NetworkConfig: rec.Bridges,
	}
	if rec.IP.IsValid() {
		info.IP = rec.IP.String()
	}
	if t.net == nil {
		return info
	}
	vxlan := &api.VXLANInfo{
		VNI:      t.net.api.VNI,
		VTEPName: t.net.api.VTEPName,
		VTEPIP:   netip.PrefixFrom(rec.VTEP, t.net.vtepNet.Bits()).String(),
		VTEPMAC:  VTEPMAC(t.net.oui, rec.VTEP).String(),
		VTEPPort: t.net.api.VTEPPort,
		VTEPMTU:  t.net.api.VTEPMTU,
	}
	for _, def := range t.net.overlays {
		l, ok := rec.Leases[def.api.Name]
		if !ok {
			continue
		}
		ov := api.AgentOverlay{Info: def.api, Backend: &api.BackendInfo{VXLAN: vxlan}}
		ov.Info.Enabled = nil
		if !def.enabled {
			ov.Info.Enabled = new(bool)
		}
		if l.Subnet.IsValid() {
			ov.Subnet = l.Subnet.String()
		}
		if l.Subnet6.IsValid() {
			ov.Subnet6 = l.Subnet6.String()
		}
		if rec.Bridges.MesosBridge || rec.Bridges.DockerBridge {
			m, d := &api.BridgeInfo{Name: "m-" + def.api.Name}, &api.BridgeInfo{Name: "d-" + def.api.Name}
			if l.Subnet.IsValid() {
				a, b := halves(l.Subnet)
				m.IP, d.IP = a.String(), b.String()
			}
			if l.Subnet6.IsValid() {
				a, b := halves(l.Subnet6)
				m.IP6, d.IP6 = a.String(), b.String()
			}
			if rec.Bridges.MesosBridge && (m.IP != "" || m.IP6 != "") {
				ov.MesosBridge = m
			}
			if rec.Bridges.DockerBridge && (d.IP != "" || d.IP6 != "") {
				ov.DockerBridge = d
			}
		}
		switch {
		case !def.enabled:
			ov.State = api.OverlayState{Status: api.StatusDisabled}
		case l.Failed != "" && !l.Subnet.IsValid() && !l.Subnet6.IsValid():
			ov.State = api.OverlayState{Status: api.StatusFailed, Error: l.Failed}
			ov.Backend = nil
		default:
			ov.State = api.OverlayState{Status: api.StatusOK, Error: l.Failed}
		}
		info.Overlays = append(info.Overlays, ov)
	}
	return info
}

// VTEPMAC derives a VTEP's MAC: the OUI's three high bytes and the VTEP IP's
// three low bytes, so it never needs storing.
func VTEPMAC(oui [3]byte, vtep netip.Addr) net.HardwareAddr {
	a := vtep.As4()
	return net.HardwareAddr{oui[0], oui[1], oui[2], a[1], a[2], a[3]}
}

// --- snapshots ---

type snapshotData struct {
	Format     int                   `json:"format"`
	Index      uint64                `json:"index"`
	StateIndex uint64                `json:"state_index"`
	Network    *api.NetworkConfig    `json:"network,omitempty"`
	Agents     []snapshotAgent       `json:"agents"`
	Tombstones map[string]uint64     `json:"tombstones"`
	Servers    map[string]serverMeta `json:"servers"`
	Requests   []snapshotRequest     `json:"requests"`
}

type snapshotAgent struct {
	ID       string                  `json:"id"`
	Hostname string                  `json:"hostname,omitempty"`
	IP       netip.Addr              `json:"ip,omitzero"`
	MeshAddr string                  `json:"mesh_addr,omitempty"`
	Bridges  api.AgentNetworkConfig  `json:"bridges"`
	VTEP     netip.Addr              `json:"vtep"`
	Leases   map[string]overlayLease `json:"leases"`
	Version  uint64                  `json:"version"`
}

type snapshotRequest struct {
	ID    string `json:"id"`
	Index uint64 `json:"index"`
}

// tableSnapshot is a point-in-time copy: records are immutable, so copying
// the maps of pointers is enough and quick.
type tableSnapshot struct {
	index, stateIndex uint64
	net               *network
	agents            []*agentRecord
	tombstones        map[string]uint64
	servers           map[string]serverMeta
	requests          []snapshotRequest
}

// Snapshot takes a point-in-time copy (raftlog.StateMachine).
func (t *LeaseTable) Snapshot() (raftlog.Snapshot, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := &tableSnapshot{
		index:      t.index,
		stateIndex: t.stateIndex,
		net:        t.net,
		tombstones: maps.Clone(t.tombstones),
		servers:    maps.Clone(t.servers),
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		s.agents = append(s.agents, t.agents[id])
	}
	s.requests = make([]snapshotRequest, len(t.requestLog))
	for i, id := range t.requestLog {
		s.requests[i] = snapshotRequest{ID: id, Index: t.requests[id]}
	}
	return s, nil
}

// WriteTo writes the snapshot as JSON.
func (s *tableSnapshot) WriteTo(w io.Writer) (int64, error) {
	d := snapshotData{Format: snapshotFormat, Index: s.index, StateIndex: s.stateIndex,
		Tombstones: s.tombstones, Servers: s.servers, Requests: s.requests}
	if s.net != nil {
		cfg := s.net.api
		d.Network = &cfg
	}
	d.Agents = make([]snapshotAgent, len(s.agents))
	for i, r := range s.agents {
		d.Agents[i] = snapshotAgent{ID: r.ID, Hostname: r.Hostname, IP: r.IP, MeshAddr: r.MeshAddr,
			Bridges: r.Bridges, VTEP: r.VTEP, Leases: r.Leases, Version: r.Version}
	}
	cw := &countingWriter{w: w}
	if err := json.NewEncoder(cw).Encode(d); err != nil {
		return cw.n, fmt.Errorf("write lease table snapshot: %w", err)
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Release is a no-op: the copy holds no resources.
func (s *tableSnapshot) Release() {}

// Restore replaces the whole state with a snapshot (raftlog.StateMachine).
func (t *LeaseTable) Restore(index uint64, r io.Reader) error {
	var d snapshotData
	if err := json.NewDecoder(r).Decode(&d); err != nil {
		return fmt.Errorf("read lease table snapshot: %w", err)
	}
	if d.Format != snapshotFormat {
		return fmt.Errorf("lease table snapshot format %d, this master reads %d", d.Format, snapshotFormat)
	}
	var n *network
	if d.Network != nil {
		var err error
		if n, err = parseNetwork(*d.Network); err != nil {
			return fmt.Errorf("snapshot network config: %w", err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reset()
	t.index, t.stateIndex, t.net = max(index, d.Index), d.StateIndex, n
	for _, a := range d.Agents {
		rec := &agentRecord{ID: a.ID, Hostname: a.Hostname, IP: a.IP, MeshAddr: a.MeshAddr,
			Bridges: a.Bridges, VTEP: a.VTEP, Leases: a.Leases, Version: a.Version}
		if rec.Leases == nil {
			rec.Leases = map[string]overlayLease{}
		}
		t.agents[a.ID] = rec
		if a.IP.IsValid() {
			t.byIP[a.IP] = a.ID
		}
	}
	if d.Tombstones != nil {
		t.tombstones = d.Tombstones
	}
	if d.Servers != nil {
		t.servers = d.Servers
	}
	for _, rq := range d.Requests {
		t.requests[rq.ID] = rq.Index
		t.requestLog = append(t.requestLog, rq.ID)
	}
	if t.net != nil {
		t.rebuildPools()
	}
	close(t.changed)
	t.changed = make(chan struct{})
	return nil
}

// stateCache keeps each agent's rendered JSON, keyed by record pointer, so
// that a state read at 10,000 agents re-renders only what changed.
type stateCache struct {
	mu     sync.Mutex
	agents map[string]cachedAgent
	// full is the encoded agents+tombstones part for fullIndex.
	full      []byte
	fullIndex uint64
	fullValid bool
}

type cachedAgent struct {
	rec  *agentRecord
	data []byte
}

// StateJSON encodes the state, reusing the encodings of unchanged records.
// leader is the current leader's id (not part of the replicated state).
func (t *LeaseTable) StateJSON(leader string) ([]byte, uint64, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.cache.mu.Lock()
	defer t.cache.mu.Unlock()
	if !t.cache.fullValid || t.cache.fullIndex != t.stateIndex {
		var buf bytes.Buffer
		ids := slices.Sorted(maps.Keys(t.agents))
		if len(ids) > 0 {
			buf.WriteString(`,"agents":[`)
			for i, id := range ids {
				rec := t.agents[id]
				c, ok := t.cache.agents[id]
				if !ok || c.rec != rec {
					data, err := json.Marshal(t.render(rec))
					if err != nil {
						return nil, 0, fmt.Errorf("encode agent %s: %w", id, err)
					}
					c = cachedAgent{rec: rec, data: data}
					t.cache.agents[id] = c
				}
				if i > 0 {
					buf.WriteByte(',')
				}
				buf.Write(c.data)
			}
			buf.WriteString(`]`)
		}
		if len(t.tombstones) > 0 {
			buf.WriteString(`,"tombstones":[`)
			for i, id := range slices.Sorted(maps.Keys(t.tombstones)) {
				if i > 0 {
					buf.WriteByte(',')
				}
				tb, _ := json.Marshal(api.Tombstone{AgentID: id, Version: t.tombstones[id]})
				buf.Write(tb)
			}
			buf.WriteString(`]`)
		}
		for id := range t.cache.agents {
			if _, ok := t.agents[id]; !ok {
				delete(t.cache.agents, id)
			}
		}
		t.cache.full, t.cache.fullIndex, t.cache.fullValid = buf.Bytes(), t.stateIndex, true
	}
	var out bytes.Buffer
	netJSON := []byte("{}")
	if t.net != nil {
		var err error
		if netJSON, err = json.Marshal(t.net.api); err != nil {
			return nil, 0, fmt.Errorf("encode network: %w", err)
		}
	}
	out.Grow(len(t.cache.full) + len(netJSON) + 64)
	out.WriteString(`{"network":`)
	out.Write(netJSON)
	out.WriteString(`,"index":`)
	out.WriteString(strconv.FormatUint(t.stateIndex, 10))
	if leader != "" {
		ld, _ := json.Marshal(leader)
		out.WriteString(`,"leader":`)
		out.Write(ld)
	}
	out.Write(t.cache.full)
	out.WriteString("}\n")
	return out.Bytes(), t.stateIndex, nil
}
