package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/snapshot"
	"github.com/carve-net/carve/prefixspace"
)

// Restoring the table from a snapshot (carve snapshot save / restore) as
// a command of the log: every master applies it at the same index, so no
// master is left behind with the old table, and the restore is an event
// (api.Restore) that agents recognise.

// ErrBadSnapshot marks a snapshot that cannot be restored (undecodable,
// of an unknown format, of another cluster, without a configuration).
var ErrBadSnapshot = errors.New("bad snapshot")

// WriteSnapshot writes the table as a snapshot file (what a Raft snapshot
// holds): carve snapshot save. The caller makes it consistent (a read
// barrier on the leader first).
func (t *LeaseTable) WriteSnapshot(w io.Writer) error {
	s, err := t.Snapshot()
	if err != nil {
		return err
	}
	defer s.Release()
	_, err = s.WriteTo(w)
	return err
}

// SnapshotInfo is what a snapshot file says of itself.
type SnapshotInfo struct {
	ClusterID  string
	StateIndex uint64
	Agents     int
}

// CheckSnapshot decodes a snapshot file and tells what it holds; the error
// (ErrBadSnapshot) says why it cannot be restored.
func CheckSnapshot(data []byte) (SnapshotInfo, error) {
	var d snapshot.Data
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&d); err != nil {
		return SnapshotInfo{}, fmt.Errorf("%w: not a carve snapshot (the output of carve snapshot save): %v", ErrBadSnapshot, err)
	}
	if _, err := decodeSnapshot(d); err != nil {
		return SnapshotInfo{}, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if d.Network == nil {
		return SnapshotInfo{}, fmt.Errorf("%w: it holds no network configuration (taken before the cluster was initialised)", ErrBadSnapshot)
	}
	return SnapshotInfo{ClusterID: d.ClusterID, StateIndex: d.StateIndex, Agents: len(d.Agents)}, nil
}

// applyRestore replaces the table with the snapshot, keeps the servers of
// this cluster, and records the restore. Every record is versioned at
// index (newer than anything an agent heard before, so the restored table
// wins over gossip of the old one), and every agent the table knew that
// the snapshot lacks gets a tombstone at index. The caller holds t.mu.
func (t *LeaseTable) applyRestore(index uint64, c *logcmd.Restore) error {
	var d snapshot.Data
	if err := json.Unmarshal(c.Snapshot, &d); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if d.Network == nil {
		return fmt.Errorf("%w: it holds no network configuration", ErrBadSnapshot)
	}
	if t.clusterID != "" && d.ClusterID != "" && d.ClusterID != t.clusterID {
		return fmt.Errorf("%w: it is of cluster %s, this cluster is %s (restore it into masters started with --restore-from on empty data directories)",
			ErrBadSnapshot, d.ClusterID, t.clusterID)
	}
	dec, err := decodeSnapshot(d)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	epoch := max(c.Epoch, t.restore.RestoreEpoch()+1, d.Restore.RestoreEpoch()+1)
	servers, clusterID := t.servers, orString(t.clusterID, d.ClusterID)
	// A restore into a table of no cluster is a whole-cluster restore
	// (--restore-from onto empty data directories): this log is new, and
	// reuses the indexes and terms of the one the snapshot came from, so
	// it gets a name of its own (see History). A restore into a running
	// cluster is a command of its log, which stays the same history.
	history := t.history
	if t.clusterID == "" {
		history = clusterID + "/" + strconv.FormatUint(epoch, 10)
	}
	gone := slices.Collect(maps.Keys(t.agents))
	for id := range t.tombstones {
		gone = append(gone, id)
	}
	// What the restore may delete, whose space it quarantines.
	before, beforeQuarantine := t.agents, t.quarantine
	revoked := t.denied.Sorted() // a restore never takes a revocation back
	used := t.usedStatements     // nor lets a used grant statement move space again
	t.reset()
	t.install(dec)
	maps.Copy(t.usedStatements, used)
	t.denied.Keep(revoked)
	// A snapshot from before a revocation holds the revoked agent's
	// record: it stays deleted (tombstoned below, with the others gone),
	// and its blocks are quarantined as its deletion quarantined them
	// (freeLeases): a live agent may hold a grant of it that the masters
	// have not heard of, which freeing them would lease a second time.
	var dropped []*agentRecord
	for _, r := range t.denied.Sorted() {
		if id := revokedAgent(r.Identity); id != "" && t.agents[id] != nil {
			if ip := t.agents[id].IP; ip.IsValid() && t.byIP[ip] == id {
				delete(t.byIP, ip)
			}
			t.unindexKeys(id, t.agents[id].Keys)
			dropped = append(dropped, t.agents[id])
			delete(t.agents, id)
			delete(t.reports, id)
			gone = append(gone, id)
		}
	}
	if c.Quarantine && len(t.agents) > 0 {
		for _, rec := range dropped {
			t.quarantineBlocks(index, rec)
		}
	}
	for id, rec := range t.agents {
		r := rec.Clone()
		r.Version = index
		t.agents[id] = r
	}
	for id, v := range t.tombstones {
		if v > index {
			t.tombstones[id] = index
		}
	}
	for _, id := range gone {
		if t.agents[id] == nil {
			t.tombstones[id] = index
		}
	}
	// The request outcomes name records of the old versions: a retry after
	// a restore is a new request.
	t.requests = newRequestTable()
	t.index, t.stateIndex, t.clusterID, t.servers = index, index, clusterID, servers
	t.restore = &api.Restore{Epoch: epoch, Index: index, From: d.StateIndex}
	t.history = history
	// Holdings acknowledgements are of the table before: a quarantine
	// release waits for new ones.
	t.usage.ClearAcks()
	t.changes.Restart(index)
	// The compaction's clock marks are of the old history's indexes.
	t.horizon, t.marks = min(t.horizon, index), nil
	if t.net != nil {
		t.rebuildSpaces()
		if c.KeepLive && len(t.agents) > 0 {
			t.keepLiveBlocks(index, before)
		}
		if c.Quarantine && len(t.agents) > 0 {
			t.quarantineDeleted(index, before, beforeQuarantine)
		}
	}
	return nil
}

// keepLiveBlocks leaves each agent the restore keeps every block the
// table before leased it (grown, or granted to it, after the snapshot;
// and a first lease it was leased when it registered again after being
// deleted, whose blocks are kept as grown ones beside the snapshot's
// first lease). The agent holds them and its containers have addresses
// there; taken back, they were free space the masters leased again while
// those addresses lived, or the lease of another agent that had let go of
// them since (returned, granted, or lost when it was deleted), whose agent
// then handed out there again. Whatever the snapshot holds there gives
// way, for the table before is what the agents act on: a quarantine (a
// deleted agent's, or this agent's own from before it registered again)
// gives up that part, as in quarantineDeleted (the table before leased it
// to this agent after that quarantine's release), and another agent's
// lease is cut as a grant out of it would be (cutLease). A kept piece
// keeps its block's origin, home and restore epoch (a return the agent
// decided on it before the restore is not stale), versioned at index. The
// caller holds t.mu and has rebuilt the spaces.
func (t *LeaseTable) keepLiveBlocks(index uint64, before map[string]*agentRecord) {
	for _, id := range slices.Sorted(maps.Keys(before)) {
		if t.agents[id] == nil {
			continue
		}
		var rec *agentRecord // the clone, once something is kept
		for _, name := range slices.Sorted(maps.Keys(before[id].Leases)) {
			if _, ok := t.agents[id].Leases[name]; !ok {
				continue // leased in the overlay after the snapshot: not restored
			}
			var kept []leaseBlock
			for _, b := range before[id].Leases[name].Blocks {
				space := t.spaces[name].family(b.Prefix.Addr().Is4())
				if space == nil {
					continue
				}
				for _, h := range space.Overlapping(b.Prefix) {
					switch {
					case h.Holder.quarantined:
						t.cutQuarantine(name, space, h.Prefix, b.Prefix)
					case h.Holder.id != id:
						t.cutLease(index, name, h.Holder.id, b.Prefix)
					}
				}
				for _, p := range freeOf(space, b.Prefix) {
					piece := b
					piece.Prefix, piece.Version = p, index
					if piece.Origin == api.BlockLeased {
						// A first lease of the table before that the
						// snapshot's is not (the agent was deleted and
						// registered again since): kept as grown blocks.
						piece.Origin, piece.Home = api.BlockGrown, p
					}
					kept = append(kept, piece)
				}
			}
			if len(kept) == 0 {
				continue
			}
			if rec == nil {
				rec = t.agents[id].Clone()
			}
			if err := t.setBlocks(rec, name, append(slices.Clone(rec.Leases[name].Blocks), kept...)); err != nil {
				continue // cannot be: kept is free space, disjoint
			}
		}
		if rec != nil {
			rec.Version = index
			t.agents[id] = rec
		}
	}
}

// cutLease takes the part inside p out of agent id's blocks of overlay
// name, as a grant out of them would (the rest stays its, in the CIDR
// decomposition), versioned at index. The caller holds t.mu.
func (t *LeaseTable) cutLease(index uint64, name, id string, p netip.Prefix) {
	old := t.agents[id]
	if old == nil {
		return
	}
	var blocks []leaseBlock
	for _, b := range old.Leases[name].Blocks {
		blocks = append(blocks, cutOut(b, p)...)
	}
	rec := old.Clone()
	if err := t.setBlocks(rec, name, blocks); err != nil {
		return // cannot be: only what it held is freed
	}
	rec.Version = index
	t.agents[id] = rec
}

// freeOf is what of p the space holds for nobody (no lease, no
// quarantine), as prefixes.
func freeOf(space *blockSpace, p netip.Prefix) []netip.Prefix {
	free := []netip.Prefix{p}
	for _, h := range space.Overlapping(p) {
		var rest []netip.Prefix
		for _, f := range free {
			rest = append(rest, prefixspace.CutOut(f, h.Prefix)...)
		}
		free = rest
	}
	return free
}

// quarantineDeleted quarantines, at index, the space that the table before
// a restore gave to agents the restored table does not hold (registered
// after the snapshot, so deleted by the restore, or already deleted and
// quarantined), wherever the restored table leases it to no agent: the
// restore deletes them as a delete command would, and a live agent may
// hold an unreported grant of theirs, which freeing the space would lease
// a second time. An agent deleted so that registers again is leased its
// own quarantined space first, so its containers keep their addresses.
// The caller holds t.mu and has rebuilt the spaces.
//
// Where the snapshot quarantines another deleted agent's space there, the
// newer claim takes that part over: the table before leased the space to
// the agent deleted now, so the older quarantine had been released since
// (every live agent had acknowledged holding no grant of its agent), and
// an agent registering again under that older id must not take back, as
// its own, space in which another host may hold an unreported grant of
// the agent deleted now.
func (t *LeaseTable) quarantineDeleted(index uint64, before map[string]*agentRecord, beforeQuarantine map[string][]quarantined) {
	keep := func(name string, q quarantined) {
		space := t.spaces[name].family(q.Prefix.Addr().Is4())
		if space == nil {
			return
		}
		for _, h := range space.Overlapping(q.Prefix) {
			if h.Holder.quarantined && h.Holder.id != q.From {
				t.cutQuarantine(name, space, h.Prefix, q.Prefix)
			}
		}
		// What is left free of q (the restored table's leases, and this
		// agent's own quarantine, stay as they are).
		for _, p := range freeOf(space, q.Prefix) {
			piece := q
			piece.Prefix = p
			if space.Add(p, quarantineHolds(q.From)) == nil {
				t.quarantine[name] = append(t.quarantine[name], piece)
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(before)) {
		if t.agents[id] != nil {
			continue
		}
		rec := before[id]
		for _, name := range slices.Sorted(maps.Keys(rec.Leases)) {
			for _, b := range rec.Leases[name].Blocks {
				keep(name, quarantineOf(index, rec, b))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(beforeQuarantine)) {
		for _, q := range beforeQuarantine[name] {
			if t.agents[q.From] == nil {
				q.Since = index
				keep(name, q)
			}
		}
	}
}

// orString is a, or b when a is empty.
func orString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// History names the Raft log the table was applied from
// (raftlog.HistoryReporter): the cluster id, and after a whole-cluster
// restore the cluster id and that restore's epoch ("<cluster id>/<epoch>").
// A data directory of before that restore holds another history, whose
// log must never be matched with this one's (it reuses its indexes and
// terms); "" while no cluster id is committed.
func (t *LeaseTable) History() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return orString(t.history, t.clusterID)
}

// LastRestore is the table's last restore (nil: none), unsigned.
func (t *LeaseTable) LastRestore() *api.Restore {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.restore
}

// AheadOfRestore tells whether index is past the state of a restored
// table: a watcher that saw it saw the history before the restore, and
// must not wait for the table to reach it.
func (t *LeaseTable) AheadOfRestore(index uint64) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.restore != nil && index > t.stateIndex
}

// writeRestoreField appends `,"restore":{...}` signed, when the table was
// restored; the caller holds t.mu (read).
func (t *LeaseTable) writeRestoreField(out *bytes.Buffer) error {
	if t.restore == nil {
		return nil
	}
	r := *t.restore
	if t.signer != nil {
		r.Signature = t.signer.Sign(api.RestoreSigningBytes(r, t.clusterID))
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode restore: %w", err)
	}
	out.WriteString(`,"restore":`)
	out.Write(b)
	return nil
}

// cutQuarantine takes the part inside by out of the quarantined block held
// of overlay name: its pieces outside by stay quarantined as they were.
func (t *LeaseTable) cutQuarantine(name string, space *blockSpace, held, by netip.Prefix) {
	qs := t.quarantine[name]
	i := slices.IndexFunc(qs, func(q quarantined) bool { return q.Prefix == held })
	if i < 0 {
		return
	}
	old := qs[i]
	space.RemoveHeld(held, quarantineHolds(old.From))
	qs = slices.Delete(qs, i, i+1)
	for _, r := range prefixspace.CutOut(held, by) {
		piece := old
		piece.Prefix = r
		if space.Add(r, quarantineHolds(old.From)) == nil {
			qs = append(qs, piece)
		}
	}
	t.quarantine[name] = qs
}
