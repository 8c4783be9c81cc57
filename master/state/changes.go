package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/carve-net/carve/master/changelog"
	"github.com/carve-net/carve/master/logcmd"
)

// The change log and tombstone compaction.
//
// Every master applies the same Raft log, so every master derives the same
// change log from it: per state index, the agents whose record or tombstone
// changed there. GET /overlay-master/changes?since=N answers from it with
// only what changed after N. The log (master/changelog) is bounded
// (changelog.DefaultIDs agent ids in all); it starts where this master's
// table started: index 0 for a table built from the whole log, the
// snapshot's state index after a restore. Changes since an index older than that, or older than the
// compaction horizon, are gone (410): the client reads the whole state.
//
// Tombstones are compacted by a command the leader proposes now and then
// with its clock (logcmd.Compact): the table keeps clock marks (Raft index,
// leader time) from those commands, and drops the tombstones at or below
// the newest mark older than the command's max age. The highest index
// compacted is the horizon, published in the state.

// SetChangeLogIDs bounds the change log to n agent ids (at least 1), before
// the table applies its first command: the bound is this master's, not
// replicated (each master answers 410 with its own oldest index).
func (t *LeaseTable) SetChangeLogIDs(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.changeLogIDs = max(n, 1)
	t.changes.SetMax(t.changeLogIDs)
}

// maxClockMarks bounds the clock marks kept for compaction; dropping the
// oldest only delays compaction.
const maxClockMarks = 1024

// touch notes that id's record or tombstone changes in the command being
// applied; the caller holds t.mu.
func (t *LeaseTable) touch(id string) { t.touched = append(t.touched, id) }

// touchAll notes that every record is re-rendered; the caller holds t.mu.
func (t *LeaseTable) touchAll() { t.touchedAll = true }

// logChanges appends what the command at index changed; the caller holds t.mu.
func (t *LeaseTable) logChanges(index uint64) {
	if len(t.touched) > 0 || t.touchedAll {
		t.changes.Add(index, slices.Compact(slices.Sorted(slices.Values(t.touched))), t.touchedAll)
	}
	t.touched, t.touchedAll = nil, false
}

// Horizon is the highest index up to which tombstones were compacted.
func (t *LeaseTable) Horizon() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.horizon
}

// OldestChanges is the oldest index that changes can be served since.
func (t *LeaseTable) OldestChanges() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return max(t.changes.Start(), t.horizon)
}

// applyCompact records a clock mark and drops the tombstones at or below
// the newest mark older than MaxAge. Deterministic: the time comes from the
// command.
func (t *LeaseTable) applyCompact(index uint64, c *logcmd.Compact) {
	t.marks = append(t.marks, clockMark{Index: index, Time: c.Now})
	t.pruneRevoked(index, c.Now/1000)
	// A used grant statement is forgotten once it expired: it no longer
	// verifies, so it cannot be posted again.
	for id, expires := range t.usedStatements {
		if expires < c.Now/1000 {
			delete(t.usedStatements, id)
		}
	}
	limit := c.Now - c.MaxAge
	cut := -1
	for i, m := range t.marks {
		if m.Time <= limit {
			cut = i
		}
	}
	if cut < 0 {
		if len(t.marks) > maxClockMarks {
			t.marks = slices.Clone(t.marks[len(t.marks)-maxClockMarks:])
		}
		return
	}
	cutoff := t.marks[cut].Index
	t.marks = slices.Clone(t.marks[cut:])
	dropped := false
	for id, v := range t.tombstones {
		if v <= cutoff {
			delete(t.tombstones, id)
			dropped = true
		}
	}
	if dropped && cutoff > t.horizon {
		t.horizon = cutoff
		t.stateIndex = index
		t.changes.Trim(cutoff)
	}
}

// ChangesJSON encodes what changed after since (api.Changes), with the
// index it runs to; a *changelog.GoneError when since is older than what is kept.
// The bytes are shared (see ChangesBody): not to be changed.
func (t *LeaseTable) ChangesJSON(since uint64) ([]byte, uint64, error) {
	b, err := t.ChangesBody(since)
	if err != nil {
		return nil, 0, err
	}
	return b.data, b.index, nil
}

// ChangesBody is what changed after since (api.Changes) as one answer,
// with its index and its gzip encoding made once; a *changelog.GoneError when since
// is older than what is kept. The answer is encoded once per since and
// state (index, usage and signing generations) and shared by every
// watcher asking for it: at 10,000 watchers of one burst, each would
// otherwise re-encode the same hundred records (128 µs each, 1.3 s for all
// on one core), and gzip them.
func (t *LeaseTable) ChangesBody(since uint64) (*StateBody, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if oldest := max(t.changes.Start(), t.horizon); since < oldest || (t.restore != nil && since > t.stateIndex) {
		// (A watcher past a restored table's index saw the history before
		// the restore: it reads the whole state.)
		return nil, &changelog.GoneError{Oldest: oldest}
	}
	t.cache.mu.Lock()
	defer t.cache.mu.Unlock()
	key := changesKey{index: t.stateIndex, usage: t.usage.Generation(), signing: t.signingGen}
	if t.cache.changesKey != key || t.cache.changes == nil {
		t.cache.changes, t.cache.changesKey = map[uint64]*StateBody{}, key
	}
	if b, ok := t.cache.changes[since]; ok {
		return b, nil
	}
	data, err := t.encodeChanges(since)
	if err != nil {
		return nil, err
	}
	b := &StateBody{index: t.stateIndex, usage: key.usage, data: data}
	if len(t.cache.changes) < maxSharedChanges {
		t.cache.changes[since] = b
	}
	return b, nil
}

// encodeChanges encodes what changed after since; the caller holds t.mu
// (read) and t.cache.mu, and checked that since is served.
func (t *LeaseTable) encodeChanges(since uint64) ([]byte, error) {
	var ids []string
	all := false
	if since < t.stateIndex {
		ids, all = t.changes.Since(since)
	}
	if all {
		ids = slices.Sorted(maps.Keys(t.agents))
		for id := range t.tombstones {
			ids = append(ids, id)
		}
		slices.Sort(ids)
	}
	var agents, tombstones []string
	for _, id := range ids {
		if t.agents[id] != nil {
			agents = append(agents, id)
		} else if _, ok := t.tombstones[id]; ok {
			tombstones = append(tombstones, id)
		}
	}
	if err := t.encodeChangedAgents(agents); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString(`{"index":`)
	out.WriteString(strconv.FormatUint(t.stateIndex, 10))
	out.WriteString(`,"since":`)
	out.WriteString(strconv.FormatUint(since, 10))
	writeJSONField(&out, "cluster_id", t.clusterID)
	writeJSONField(&out, "signing_key", t.signer.PublicKey())
	t.signer.WriteSigningChain(&out)
	if t.horizon > 0 {
		out.WriteString(`,"horizon":`)
		out.WriteString(strconv.FormatUint(t.horizon, 10))
	}
	out.Write(t.denied.Field())
	if err := t.writeRestoreField(&out); err != nil {
		return nil, err
	}
	if all && t.net != nil {
		netJSON, err := json.Marshal(t.net.Config())
		if err != nil {
			return nil, fmt.Errorf("encode network: %w", err)
		}
		out.WriteString(`,"network":`)
		out.Write(netJSON)
	}
	if len(agents) > 0 {
		out.WriteString(`,"agents":[`)
		for i, id := range agents {
			if i > 0 {
				out.WriteByte(',')
			}
			out.Write(t.cache.agents[id].data)
		}
		out.WriteString(`]`)
	}
	if len(tombstones) > 0 {
		out.WriteString(`,"tombstones":[`)
		for i, id := range tombstones {
			if i > 0 {
				out.WriteByte(',')
			}
			data, err := t.encodeTombstone(id)
			if err != nil {
				return nil, err
			}
			out.Write(data)
		}
		out.WriteString(`]`)
	}
	out.WriteString("}\n")
	return out.Bytes(), nil
}
