package state

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/snapshot"
	"github.com/carve-net/carve/raftlog"
)

// The table's snapshots (raftlog.StateMachine): a point-in-time copy,
// written in master/snapshot's format, and the restore of one.

// tableSnapshot is a point-in-time copy: records are immutable, so copying
// the maps of pointers is enough and quick.
type tableSnapshot struct {
	index, stateIndex uint64
	clusterID         string
	net               *network
	agents            []*agentRecord
	tombstones        map[string]uint64
	servers           map[string]ServerMeta
	quarantine        map[string][]quarantined
	requests          []snapshot.Request
	horizon           uint64
	marks             []clockMark
	reports           map[string]agentReport
	revoked           []api.Revocation
	statements        map[string]int64
	restore           *api.Restore
	history           string
	// replaced holds, by position in requests, the outcome records that are
	// no longer their agent's current record; encoded in WriteTo.
	replaced map[int]*agentRecord
}

// Snapshot takes a point-in-time copy (raftlog.StateMachine).
func (t *LeaseTable) Snapshot() (raftlog.Snapshot, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := &tableSnapshot{
		index:      t.index,
		stateIndex: t.stateIndex,
		clusterID:  t.clusterID,
		net:        t.net,
		tombstones: maps.Clone(t.tombstones),
		servers:    maps.Clone(t.servers),
		reports:    maps.Clone(t.reports),
		quarantine: maps.Clone(t.quarantine), // slices are replaced, never changed in place
		replaced:   map[int]*agentRecord{},
		horizon:    t.horizon,
		marks:      slices.Clone(t.marks),
		revoked:    t.denied.Sorted(),
		restore:    t.restore,
		history:    t.history,
		statements: maps.Clone(t.usedStatements),
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		s.agents = append(s.agents, t.agents[id])
	}
	s.requests = make([]snapshot.Request, len(t.requests.order))
	for i, id := range t.requests.order {
		o := t.requests.byID[id]
		s.requests[i] = snapshot.Request{ID: id, Index: o.Index, Op: o.Op, Digest: o.Digest, Deleted: o.Deleted}
		switch {
		case o.Agent == nil:
		case t.agents[o.Agent.ID] == o.Agent:
			s.requests[i].CurrentAgent = o.Agent.ID
		default:
			s.replaced[i] = o.Agent
		}
	}
	return s, nil
}

// WriteTo writes the snapshot as JSON.
func (s *tableSnapshot) WriteTo(w io.Writer) (int64, error) {
	d := snapshot.Data{Format: snapshot.Format, Index: s.index, StateIndex: s.stateIndex, ClusterID: s.clusterID,
		Tombstones: s.tombstones, Servers: s.servers, Requests: s.requests, Reports: s.reports, Quarantine: s.quarantine,
		Horizon: s.horizon, Marks: s.marks, Revoked: s.revoked, Restore: s.restore, UsedStatements: s.statements,
		History: s.history}
	if s.net != nil {
		cfg := s.net.Config()
		d.Network = &cfg
	}
	d.Agents = make([]snapshot.Agent, len(s.agents))
	for i, r := range s.agents {
		d.Agents[i] = snapshot.AgentOf(r)
	}
	for i, r := range s.replaced {
		a := snapshot.AgentOf(r)
		d.Requests[i].Agent = &a
	}
	return snapshot.Write(w, &d)
}

// Release is a no-op: the copy holds no resources.
func (s *tableSnapshot) Release() {}

// Restore replaces the whole state with a snapshot (raftlog.StateMachine).
func (t *LeaseTable) Restore(index uint64, r io.Reader) error {
	var d snapshot.Data
	if err := json.NewDecoder(r).Decode(&d); err != nil {
		return fmt.Errorf("read lease table snapshot: %w", err)
	}
	dec, err := decodeSnapshot(d)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reset()
	t.install(dec)
	t.index, t.stateIndex, t.clusterID = max(index, d.Index), d.StateIndex, d.ClusterID
	if d.Servers != nil {
		t.servers = d.Servers
	}
	t.restore, t.history = d.Restore, d.History
	// The change log starts here: what changed before the snapshot is not
	// known one by one (a watcher further behind reads the whole state).
	t.changes.Restart(d.StateIndex)
	if t.net != nil {
		t.rebuildSpaces()
	}
	t.notifyChanged()
	return nil
}

// decodedSnapshot is a snapshot checked and turned into the table's
// structures, ready to install.
type decodedSnapshot struct {
	d        snapshot.Data
	net      *network
	agents   map[string]*agentRecord
	requests requestTable
}

// decodeSnapshot checks a snapshot and builds what install puts in place.
func decodeSnapshot(d snapshot.Data) (*decodedSnapshot, error) {
	if err := d.CheckFormat(); err != nil {
		return nil, err
	}
	legacy := func(rec *agentRecord) *agentRecord {
		if d.Format < snapshot.FormatBlocks {
			legacyLeaseBlocks(rec)
		}
		return rec
	}
	dec := &decodedSnapshot{d: d}
	if d.Network != nil {
		var err error
		if dec.net, err = netconfig.New(*d.Network); err != nil {
			return nil, fmt.Errorf("snapshot network config: %w", err)
		}
	}
	dec.agents = make(map[string]*agentRecord, len(d.Agents))
	for _, a := range d.Agents {
		dec.agents[a.ID] = legacy(a.Record())
	}
	dec.requests = newRequestTable()
	for _, rq := range d.Requests {
		o := requestOutcome{Index: rq.Index, Op: rq.Op, Digest: rq.Digest, Deleted: rq.Deleted}
		switch {
		case rq.CurrentAgent != "":
			if o.Agent = dec.agents[rq.CurrentAgent]; o.Agent == nil {
				return nil, fmt.Errorf("lease table snapshot: request %q names agent %q, which the snapshot lacks", rq.ID, rq.CurrentAgent)
			}
		case rq.Agent != nil:
			o.Agent = legacy(rq.Agent.Record())
		}
		dec.requests.remember(rq.ID, o)
	}
	return dec, nil
}

// install puts a decoded snapshot's agents, tombstones, requests, reports,
// quarantine, compaction and network in the table, which reset emptied;
// the caller holds t.mu and sets the indexes, the cluster id, the servers
// and the restore, then rebuilds the spaces.
func (t *LeaseTable) install(dec *decodedSnapshot) {
	d := dec.d
	t.net, t.agents, t.requests = dec.net, dec.agents, dec.requests
	for _, a := range d.Agents {
		if a.IP.IsValid() {
			t.byIP[a.IP] = a.ID
		}
	}
	for id, rec := range t.agents {
		t.indexKeys(id, rec.Keys)
	}
	if d.Tombstones != nil {
		t.tombstones = d.Tombstones
	}
	t.horizon, t.marks = d.Horizon, d.Marks
	for id, rep := range d.Reports {
		if dec.agents[id] != nil {
			t.reports[id] = rep
		}
	}
	if d.Quarantine != nil {
		t.quarantine = d.Quarantine
	}
	maps.Copy(t.usedStatements, d.UsedStatements)
	t.denied.Load(d.Revoked)
}
