package membership

// The masters' compaction horizon (api.State.Horizon). The masters drop the
// tombstones at or below it; a record or tombstone at or below it that the
// masters do not hold is gone for good. After a whole master state, this
// membership holds every record at or below the horizon that the masters
// hold, so gossip of an unknown agent's record at or below it, or of a
// tombstone at or below it, is late gossip of something compacted: merge
// refuses it, else a peer that missed the deletion could bring a deleted
// agent back for ever.

// Horizon is the masters' compaction horizon last seen (0: none).
func (m *Membership) Horizon() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.horizon
}

// Compact raises the horizon to h (never lowers it) and drops the
// tombstones at or below it; it reports whether it dropped any.
func (m *Membership) Compact(h uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.compactLocked(h)
}

func (m *Membership) compactLocked(h uint64) bool {
	m.horizon = max(m.horizon, h)
	dropped := false
	for id, t := range m.tombstones {
		if t.Version <= m.horizon {
			delete(m.tombstones, id)
			m.gen++
			dropped = true
		}
	}
	return dropped
}

// SyncWithMasters completes a whole master state already merged
// (MergeFromMasters): it raises the horizon to the state's, drops the
// tombstones at or below it, and drops the records at or below it of the
// agents the state does not hold (held: the ids of its records); those are
// compacted deletions this agent missed. Records above the horizon stay:
// their deletion is a tombstone the state carries, or they are newer than
// the master that answered. It returns the ids of the records dropped.
func (m *Membership) SyncWithMasters(held map[string]bool, horizon uint64) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.compactLocked(horizon)
	var dropped []string
	for id, r := range m.records {
		if r.Version <= m.horizon && !held[id] {
			delete(m.records, id)
			delete(m.fromMasters, id)
			m.gen++
			dropped = append(dropped, id)
		}
	}
	return dropped
}

// compacted tells whether gossip of this record is of a compacted agent:
// at or below the horizon, of an agent this membership does not hold. The
// caller holds m.mu.
func (m *Membership) compacted(id string, version uint64) bool {
	_, held := m.records[id]
	return version <= m.horizon && !held
}
