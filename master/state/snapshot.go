package state

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/raftlog"
)

// Versions of the snapshot encoding. Format 3 added the IPv6 VTEP
// addresses, the agents' configuration reports, the blocks of every lease,
// the records' creation index and the quarantine; format 2 added the
// cluster id and the outcomes of requests. Format 1 and 2 snapshots still
// restore: without reports (every overlay shows STATUS_CONFIGURING until
// its agent reports), and their records get the lease blocks of their
// subnets.
const (
	snapshotFormat       = 3
	snapshotFormatBlocks = 3
	snapshotFormatLegacy = 1
)

type snapshotData struct {
	Format     int                      `json:"format"`
	Index      uint64                   `json:"index"`
	StateIndex uint64                   `json:"state_index"`
	ClusterID  string                   `json:"cluster_id,omitempty"`
	Network    *api.NetworkConfig       `json:"network,omitempty"`
	Agents     []snapshotAgent          `json:"agents"`
	Tombstones map[string]uint64        `json:"tombstones"`
	Servers    map[string]ServerMeta    `json:"servers"`
	Requests   []snapshotRequest        `json:"requests"`
	Reports    map[string]agentReport   `json:"reports,omitempty"`
	Quarantine map[string][]quarantined `json:"quarantine,omitempty"`
	// Horizon and Marks are the tombstone compaction's (changes.go).
	Horizon uint64      `json:"horizon,omitempty"`
	Marks   []clockMark `json:"marks,omitempty"`
	// Revoked is the deny list of certificates (revocation.go).
	Revoked []api.Revocation `json:"revoked,omitempty"`
	// Restore is the last restore from a snapshot (restore.go), unsigned.
	Restore *api.Restore `json:"restore,omitempty"`
	// UsedStatements are the grant statements that moved space, with
	// their expiry (growth.go).
	UsedStatements map[string]int64 `json:"used_statements,omitempty"`
	// History names the Raft log the table was applied from, when a
	// whole-cluster restore started it (restore.go; "": the cluster id).
	History string `json:"history,omitempty"`
}

type snapshotAgent struct {
	ID       string                  `json:"id"`
	Hostname string                  `json:"hostname,omitempty"`
	IP       netip.Addr              `json:"ip,omitzero"`
	MeshAddr string                  `json:"mesh_addr,omitempty"`
	Bridges  api.AgentNetworkConfig  `json:"bridges"`
	Keys     api.AgentKeys           `json:"keys,omitzero"`
	MTU      int                     `json:"underlay_mtu,omitempty"`
	VTEP     netip.Addr              `json:"vtep"`
	VTEP6    netip.Addr              `json:"vtep6,omitzero"`
	Leases   map[string]overlayLease `json:"leases"`
	Version  uint64                  `json:"version"`
	Created  uint64                  `json:"created,omitempty"`
	// CarveVersion is the agent's carve version (informational).
	CarveVersion string `json:"carve_version,omitempty"`
}

// snapshotRequest is one remembered request. A registration's outcome is
// usually the agent's current record, named by CurrentAgent; only a record
// replaced since is written out in Agent.
type snapshotRequest struct {
	ID           string         `json:"id"`
	Index        uint64         `json:"index"`
	Op           string         `json:"op,omitempty"`
	Digest       string         `json:"digest,omitempty"`
	CurrentAgent string         `json:"current_agent,omitempty"`
	Agent        *snapshotAgent `json:"agent,omitempty"`
	Deleted      []string       `json:"deleted,omitempty"`
}

func snapshotAgentOf(r *agentRecord) snapshotAgent {
	return snapshotAgent{ID: r.ID, Hostname: r.Hostname, IP: r.IP, MeshAddr: r.MeshAddr,
		Bridges: r.Bridges, Keys: r.Keys, MTU: r.UnderlayMTU, VTEP: r.VTEP, VTEP6: r.VTEP6, Leases: r.Leases, Version: r.Version, Created: r.Created,
		CarveVersion: r.CarveVersion}
}

func (a snapshotAgent) record() *agentRecord {
	rec := &agentRecord{ID: a.ID, Hostname: a.Hostname, IP: a.IP, MeshAddr: a.MeshAddr,
		Bridges: a.Bridges, Keys: a.Keys, UnderlayMTU: a.MTU, VTEP: a.VTEP, VTEP6: a.VTEP6, Leases: a.Leases, Version: a.Version, Created: a.Created,
		CarveVersion: a.CarveVersion}
	if rec.Leases == nil {
		rec.Leases = map[string]overlayLease{}
	}
	return rec
}

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
	requests          []snapshotRequest
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
		revoked:    t.revokedList(),
		restore:    t.restore,
		history:    t.history,
		statements: maps.Clone(t.usedStatements),
	}
	for _, id := range slices.Sorted(maps.Keys(t.agents)) {
		s.agents = append(s.agents, t.agents[id])
	}
	s.requests = make([]snapshotRequest, len(t.requests.order))
	for i, id := range t.requests.order {
		o := t.requests.byID[id]
		s.requests[i] = snapshotRequest{ID: id, Index: o.Index, Op: o.Op, Digest: o.Digest, Deleted: o.Deleted}
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
	d := snapshotData{Format: snapshotFormat, Index: s.index, StateIndex: s.stateIndex, ClusterID: s.clusterID,
		Tombstones: s.tombstones, Servers: s.servers, Requests: s.requests, Reports: s.reports, Quarantine: s.quarantine,
		Horizon: s.horizon, Marks: s.marks, Revoked: s.revoked, Restore: s.restore, UsedStatements: s.statements,
		History: s.history}
	if s.net != nil {
		cfg := s.net.Config()
		d.Network = &cfg
	}
	d.Agents = make([]snapshotAgent, len(s.agents))
	for i, r := range s.agents {
		d.Agents[i] = snapshotAgentOf(r)
	}
	for i, r := range s.replaced {
		a := snapshotAgentOf(r)
		d.Requests[i].Agent = &a
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
	d        snapshotData
	net      *network
	agents   map[string]*agentRecord
	requests requestTable
}

// decodeSnapshot checks a snapshot and builds what install puts in place.
func decodeSnapshot(d snapshotData) (*decodedSnapshot, error) {
	if d.Format < snapshotFormatLegacy || d.Format > snapshotFormat {
		return nil, fmt.Errorf("lease table snapshot format %d, this master reads %d to %d", d.Format, snapshotFormatLegacy, snapshotFormat)
	}
	legacy := func(rec *agentRecord) *agentRecord {
		if d.Format < snapshotFormatBlocks {
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
		dec.agents[a.ID] = legacy(a.record())
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
			o.Agent = legacy(rq.Agent.record())
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
	for _, r := range d.Revoked {
		t.revoked[r.Serial] = r
	}
	maps.Copy(t.usedStatements, d.UsedStatements)
	t.revokedChanged()
	if len(t.revoked) > 0 {
		t.signalRevoked()
	}
}
