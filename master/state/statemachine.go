package state

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/record"
)

// overlaySpace is the address space of one overlay: a block allocator per
// family (nil when the overlay has no subnet of that family).
type overlaySpace struct {
	v4, v6 *blockSpace
}

// family returns the allocator of p's family.
func (s *overlaySpace) family(is4 bool) *blockSpace {
	if s == nil {
		return nil
	}
	if is4 {
		return s.v4
	}
	return s.v6
}

// Apply applies one command at a Raft index (raftlog.StateMachine).
func (t *LeaseTable) Apply(index uint64, data []byte) any {
	c, err := logcmd.Decode(data)
	if err != nil {
		return Result{Err: err}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.index
	if index > t.index {
		t.index = index
	}
	before := t.stateIndex
	res := t.applyCommand(index, c)
	if t.stateIndex != before {
		t.logChanges(index)
		t.notifyChanged()
	} else {
		t.touched, t.touchedAll = nil, false
	}
	t.recordDigestIfDue(prev, index)
	return res
}

// applyCommand applies a validated command; the caller holds t.mu.
func (t *LeaseTable) applyCommand(index uint64, c logcmd.Command) Result {
	var digest string
	if c.RequestID != "" {
		digest = c.Digest()
		if o, ok := t.requests.lookup(c.RequestID); ok {
			return t.repeatedRequest(c, digest, o)
		}
	}
	outcome := requestOutcome{Index: index, Op: c.Op, Digest: digest}
	var res Result
	switch c.Op {
	case logcmd.OpRegister:
		rec, err := t.applyRegister(index, c.Register)
		if err != nil {
			return Result{Err: err}
		}
		outcome.Agent = rec
		res.Agent = t.render(rec)
	case logcmd.OpDelete, logcmd.OpRevoke:
		var deleted []string
		var err error
		if c.Op == logcmd.OpDelete {
			deleted, err = t.applyDelete(index, c.Delete)
		} else {
			deleted, err = t.applyRevoke(index, c.Revoke)
		}
		if err != nil {
			return Result{Err: err}
		}
		outcome.Deleted = deleted
		res.Deleted = deleted
	case logcmd.OpReport:
		rec, err := t.applyReport(index, c.Report)
		if err != nil {
			return Result{Err: err}
		}
		res.Agent = t.render(rec)
	case logcmd.OpGrow, logcmd.OpReturn, logcmd.OpGrant:
		var rec *agentRecord
		var err error
		switch c.Op {
		case logcmd.OpGrow:
			rec, err = t.applyGrow(index, c.Grow)
		case logcmd.OpReturn:
			rec, err = t.applyReturn(index, c.Return)
		default:
			rec, err = t.applyGrant(index, c.Grant)
		}
		if err != nil {
			return Result{Err: err}
		}
		outcome.Agent = rec
		res.Agent = t.render(rec)
	case logcmd.OpRelease:
		res.Released = t.applyRelease(index, c.Release)
	case logcmd.OpSetConfig:
		res = t.applySetConfig(index, *c.SetConfig)
	case logcmd.OpSetClusterID:
		t.applySetClusterID(index, c.ClusterID)
	case logcmd.OpServerMeta:
		t.servers[c.ServerMeta.ID] = *c.ServerMeta
	case logcmd.OpCompact:
		t.applyCompact(index, c.Compact)
	case logcmd.OpRestore:
		if err := t.applyRestore(index, c.Restore); err != nil {
			return Result{Err: err}
		}
	}
	if c.RequestID != "" && res.Err == nil {
		t.requests.remember(c.RequestID, outcome)
	}
	return res
}

// repeatedRequest answers a request id seen before: a retry of the same
// request (after an unknown outcome) gets that request's own outcome, and the
// state does not change again; another request reusing the id is refused.
func (t *LeaseTable) repeatedRequest(c logcmd.Command, digest string, o requestOutcome) Result {
	legacy := o.Digest == "" // restored from a snapshot that kept no outcomes
	if !legacy && o.Digest != digest {
		return Result{Err: fmt.Errorf("%w: request_id %q named a %s request applied at index %d, not this %s request; give every new request a new request_id",
			ErrRequestIDReused, c.RequestID, o.Op, o.Index, c.Op)}
	}
	switch c.Op {
	case logcmd.OpGrow, logcmd.OpReturn, logcmd.OpGrant:
		return Result{Agent: record.Render(t.net, o.Agent)}
	case logcmd.OpRegister:
		rec := o.Agent
		if legacy {
			if rec = t.agents[c.Register.AgentID]; rec == nil {
				return Result{Err: fmt.Errorf("%w: %s was deleted after it registered", ErrUnknownAgent, c.Register.AgentID)}
			}
		}
		return Result{Agent: t.render(rec)}
	case logcmd.OpReport:
		rec := t.agents[c.Report.AgentID]
		if rec == nil {
			return Result{Err: fmt.Errorf("%w %q", ErrUnknownAgent, c.Report.AgentID)}
		}
		return Result{Agent: t.render(rec)}
	case logcmd.OpDelete:
		if legacy {
			return Result{Deleted: c.Delete.Agents}
		}
		return Result{Deleted: o.Deleted}
	case logcmd.OpRevoke:
		return Result{Deleted: o.Deleted}
	}
	return Result{}
}

// applyRegister creates or updates an agent's record and returns it.
func (t *LeaseTable) applyRegister(index uint64, c *logcmd.Register) (*agentRecord, error) {
	if t.net == nil {
		return nil, ErrNoConfig
	}
	ip, err := netip.ParseAddr(c.IP)
	if err != nil {
		return nil, fmt.Errorf("%w: ip %q", ErrBadCommand, c.IP)
	}
	old := t.agents[c.AgentID]
	if old == nil || old.Keys != c.Keys {
		if err := t.keysFree(c.AgentID, c.Keys); err != nil {
			return nil, err
		}
	}
	var rec *agentRecord
	if old == nil {
		rec = &agentRecord{ID: c.AgentID, Leases: map[string]overlayLease{}, Created: index}
		n, ok := t.vteps.Allocate(c.AgentID)
		if !ok {
			return nil, fmt.Errorf("%w in vtep_subnet %s", ErrVTEPExhausted, t.net.VTEPNet())
		}
		rec.VTEP = t.vteps.AddrAt(n)
	} else {
		rec = old.Clone()
	}
	rec.Hostname, rec.IP, rec.MeshAddr, rec.Bridges = c.Hostname, ip, c.MeshAddr, c.Bridges
	rec.Keys, rec.UnderlayMTU, rec.CarveVersion = c.Keys, c.UnderlayMTU, c.CarveVersion
	// The newest registration takes the IP; the older record keeps its
	// leases without an IP until it registers again.
	if other, ok := t.byIP[ip]; ok && other != c.AgentID {
		o := t.agents[other].Clone()
		o.IP = netip.Addr{}
		o.Version = index
		t.agents[other] = o
		t.touch(other)
		t.stateIndex = index
	}
	t.ensureLeases(rec, index)
	if old != nil && old.Equal(rec) {
		return old, nil
	}
	if old != nil && old.IP.IsValid() && old.IP != ip && t.byIP[old.IP] == c.AgentID {
		delete(t.byIP, old.IP)
	}
	t.byIP[ip] = c.AgentID
	rec.Version = index
	if old != nil {
		t.unindexKeys(c.AgentID, old.Keys)
	}
	t.indexKeys(c.AgentID, rec.Keys)
	t.agents[c.AgentID] = rec
	delete(t.tombstones, c.AgentID)
	t.touch(c.AgentID)
	t.stateIndex = index
	return rec, nil
}

// ensureLeases gives rec a subnet of every enabled overlay it lacks (a
// whole free prefix-sized slice, first fit, whose halves become its lease
// blocks) and an IPv6 VTEP address when vtep_subnet6 is configured, and
// records why when an overlay is exhausted.
func (t *LeaseTable) ensureLeases(rec *agentRecord, index uint64) {
	if t.vteps6 != nil && !rec.VTEP6.IsValid() {
		if n, ok := t.vteps6.Allocate(rec.ID); ok {
			rec.VTEP6 = t.vteps6.AddrAt(n)
		}
	}
	for def := range t.net.Overlays() {
		if !def.Enabled() {
			continue
		}
		l := rec.Leases[def.Name()]
		sp := t.spaces[def.Name()]
		l.Failed = ""
		var failures []string
		if def.Subnet().IsValid() && !l.Subnet.IsValid() {
			if p, ok := t.reclaimOwnSlice(def.Name(), sp.v4, rec.ID, def.Prefix()); ok {
				l.Subnet = p
				l.Blocks = t.takeLeaseBlocks(sp.v4, rec.ID, l.Blocks, p, index)
			} else if p, ok := sp.v4.FirstFree(def.Prefix()); ok {
				l.Subnet = p
				l.Blocks = t.takeLeaseBlocks(sp.v4, rec.ID, l.Blocks, p, index)
			} else {
				failures = append(failures, fmt.Sprintf("exhausted: no free /%d left in %s", def.Prefix(), def.Subnet()))
			}
		}
		if def.Subnet6().IsValid() && !l.Subnet6.IsValid() {
			if p, ok := t.reclaimOwnSlice(def.Name(), sp.v6, rec.ID, def.Prefix6()); ok {
				l.Subnet6 = p
				l.Blocks = t.takeLeaseBlocks(sp.v6, rec.ID, l.Blocks, p, index)
			} else if p, ok := sp.v6.FirstFree(def.Prefix6()); ok {
				l.Subnet6 = p
				l.Blocks = t.takeLeaseBlocks(sp.v6, rec.ID, l.Blocks, p, index)
			} else {
				failures = append(failures, fmt.Sprintf("exhausted: no free /%d left in %s", def.Prefix6(), def.Subnet6()))
			}
		}
		if len(failures) > 0 {
			l.Failed = failures[0]
			if len(failures) > 1 {
				l.Failed += "; " + failures[1]
			}
		}
		rec.Leases[def.Name()] = t.reclaimOwnQuarantine(rec, def, l, index)
	}
}

// applyDelete removes agents (by id or underlay IP) and returns the ids it
// removed.
func (t *LeaseTable) applyDelete(index uint64, c *logcmd.Delete) ([]string, error) {
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
				return nil, fmt.Errorf("%w %q", ErrUnknownAgent, name)
			}
			continue
		}
		delete(t.agents, id)
		t.unindexKeys(id, rec.Keys)
		delete(t.reports, id)
		t.freeLeases(index, rec, len(t.agents) > 0)
		if rec.IP.IsValid() && t.byIP[rec.IP] == id {
			delete(t.byIP, rec.IP)
		}
		t.tombstones[id] = index
		t.touch(id)
		t.stateIndex = index
		deleted = append(deleted, id)
	}
	if len(t.agents) == 0 {
		// Nobody is left who could hold an unreported grant.
		t.releaseQuarantine(func(quarantined) bool { return true })
	}
	return deleted, nil
}

// freeLeases frees the VTEP IP and every block of a deleted agent, and
// nothing of anyone else's. With other agents live, its overlay blocks are
// quarantined instead of freed: one of them may hold a grant from it that
// the masters have not heard of (see applyRelease).
func (t *LeaseTable) freeLeases(index uint64, rec *agentRecord, quarantine bool) {
	if n, ok := t.vteps.Number(rec.VTEP); ok && t.vteps.Owner(n) == rec.ID {
		t.vteps.Release(n)
	}
	if t.vteps6 != nil && rec.VTEP6.IsValid() {
		if n, ok := t.vteps6.Number(rec.VTEP6); ok && t.vteps6.Owner(n) == rec.ID {
			t.vteps6.Release(n)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rec.Leases)) {
		sp := t.spaces[name]
		for _, b := range rec.Leases[name].Blocks {
			space := sp.family(b.Prefix.Addr().Is4())
			if space == nil || !space.RemoveHeld(b.Prefix, agentHolds(rec.ID)) {
				continue
			}
			if quarantine {
				_ = space.Add(b.Prefix, quarantineHolds(rec.ID)) // just freed: cannot overlap
				t.quarantine[name] = append(t.quarantine[name], quarantineOf(index, rec, b))
			}
		}
	}
}

// quarantineBlocks records every overlay block of rec, an agent deleted at
// index whose record is no longer in the table, as quarantined; the
// allocators are not touched (the caller rebuilds them: a restore).
func (t *LeaseTable) quarantineBlocks(index uint64, rec *agentRecord) {
	for _, name := range slices.Sorted(maps.Keys(rec.Leases)) {
		for _, b := range rec.Leases[name].Blocks {
			t.quarantine[name] = append(t.quarantine[name], quarantineOf(index, rec, b))
		}
	}
}

// quarantineOf is block b of rec, deleted at index, as quarantined space.
func quarantineOf(index uint64, rec *agentRecord, b record.Block) quarantined {
	return quarantined{Prefix: b.Prefix, From: rec.ID, Since: index, Bridge: b.Bridge, ClaimKey: rec.Keys.Claim}
}

// applySetConfig merges a (validated) configuration into the state.
func (t *LeaseTable) applySetConfig(index uint64, cfg api.NetworkConfig) Result {
	merged, warnings, err := t.mergeConfig(cfg)
	if err != nil {
		return Result{Err: err, Warnings: warnings}
	}
	if t.net != nil && netconfig.Equal(t.net.Config(), merged.Config()) {
		return Result{Warnings: warnings}
	}
	t.net = merged
	t.rebuildSpaces()
	t.cache.mu.Lock()
	t.cache.invalidate()
	t.cache.mu.Unlock()
	// Give existing agents their share of overlays added or enabled now;
	// sorted so every replica allocates in the same order.
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		old := t.agents[id]
		rec := old.Clone()
		t.ensureLeases(rec, index)
		if !old.Equal(rec) {
			rec.Version = index
			t.agents[id] = rec
		}
	}
	t.touchAll()
	t.stateIndex = index
	return Result{Warnings: warnings, ConfigChanged: true}
}

// applySetClusterID records the cluster id. The first one committed wins: a
// second leader proposing its own (before it saw the first) changes nothing,
// so every replica and every restart agrees on one id.
func (t *LeaseTable) applySetClusterID(index uint64, id string) {
	if t.clusterID != "" {
		return
	}
	t.clusterID = id
	t.touchAll()
	t.stateIndex = index
	// Signatures cover the cluster id.
	t.cache.mu.Lock()
	t.cache.invalidate()
	t.cache.mu.Unlock()
}

// rebuildSpaces recreates every allocator from the records and the
// quarantine (after a config change or a restore). Leases outside the
// current definitions are dropped from the allocators but stay in the
// records until the agent is deleted.
func (t *LeaseTable) rebuildSpaces() {
	t.vteps = newHostPool(t.net.VTEPNet())
	t.vteps6 = nil
	if t.net.VTEPNet6().IsValid() {
		t.vteps6 = newHostPool(t.net.VTEPNet6())
	}
	t.spaces = map[string]*overlaySpace{}
	for d := range t.net.Overlays() {
		sp := &overlaySpace{}
		if d.Subnet().IsValid() {
			sp.v4 = newBlockSpace(d.Subnet())
		}
		if d.Subnet6().IsValid() {
			sp.v6 = newBlockSpace(d.Subnet6())
		}
		t.spaces[d.Name()] = sp
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		rec := t.agents[id]
		if n, ok := t.vteps.Number(rec.VTEP); ok {
			t.vteps.Take(n, id)
		}
		if t.vteps6 != nil && rec.VTEP6.IsValid() {
			if n, ok := t.vteps6.Number(rec.VTEP6); ok {
				t.vteps6.Take(n, id)
			}
		}
		for name, l := range rec.Leases {
			for _, b := range l.Blocks {
				if space := t.spaces[name].family(b.Prefix.Addr().Is4()); space != nil {
					_ = space.Add(b.Prefix, agentHolds(id)) // records never overlap
				}
			}
		}
	}
	for name, qs := range t.quarantine {
		for _, q := range qs {
			if space := t.spaces[name].family(q.Prefix.Addr().Is4()); space != nil {
				_ = space.Add(q.Prefix, quarantineHolds(q.From))
			}
		}
	}
}

// applyReport records an agent's configuration report. It changes the
// state (and its index) only when the report differs from the last one,
// and never the record's version: peers act on records, not on reports.
func (t *LeaseTable) applyReport(index uint64, c *logcmd.Report) (*agentRecord, error) {
	rec := t.agents[c.AgentID]
	if rec == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownAgent, c.AgentID)
	}
	rep, err := record.ReportOf(c.Report)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCommand, err)
	}
	if rep.Version > rec.Version {
		return nil, fmt.Errorf("%w: agent %s reported on version %d of its record, which is at version %d", ErrReportAhead, c.AgentID, rep.Version, rec.Version)
	}
	if old, ok := t.reports[c.AgentID]; ok && old.Equal(rep) {
		return rec, nil
	}
	t.reports[c.AgentID] = rep
	t.stateIndex = index
	// Watchers of changes get the re-rendered record (same version).
	t.touch(c.AgentID)
	// The record is unchanged (its cached encoding is keyed by it), its
	// rendering is not.
	t.cache.mu.Lock()
	delete(t.cache.agents, c.AgentID)
	t.cache.mu.Unlock()
	return rec, nil
}

// Result is what applying a command hands back to its proposer.
type Result struct {
	Agent    *api.AgentInfo
	Deleted  []string
	Warnings []string
	// ConfigChanged: a configuration command changed the committed one.
	ConfigChanged bool
	// Released is the number of quarantined blocks a release freed.
	Released int
	Err      error
}
