// Package store is the agent's data dir on disk: one bbolt file holding its
// id, its last known state (its own record, the network configuration, the
// masters' index, cluster id and restore epoch, the signing key it pinned)
// and the membership, one entry per agent id, written in one fsynced
// transaction per change, so that an agent restarted while no master
// answers programs its kernel from what it knew. The agent's IPAM shares
// the file (DB) for its own buckets. The store checks nothing: what it
// holds was verified before it was saved, and the agent checks it again
// when it loads it.
package store

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
)

// The agent's local state lives in one bbolt file, written in one
// transaction per change and fsynced before the change is acted on.
const (
	storeFile   = "agent.db"
	agentBucket = "agent"
	keyID       = "id"
	keySelf     = "self"
	keyNetwork  = "network"
	keyIndex    = "master_index"
	keyCluster  = "cluster_id"
	keySignKey  = "signing_key"
	keyHorizon  = "horizon"
	keyEpoch    = "restore_epoch"
	keyFloor    = "restore_floor"
	// membersBucket holds the membership, one key per agent id
	// (memberEntry), so that a change writes what changed.
	membersBucket = "members"
	// keyMembers and keyMasters held the whole membership and the ids
	// whose record is the masters' copy in one value each (before
	// membersBucket): read once, then replaced.
	keyMembers = "membership"
	keyMasters = "membership_from_masters"
)

// memberEntry is what the store holds of one agent id.
type memberEntry struct {
	Record      *membership.PeerRecord `json:"r,omitempty"`
	Tombstone   *api.Tombstone         `json:"t,omitempty"`
	FromMasters bool                   `json:"m,omitempty"`
}

func (e *memberEntry) equal(o *memberEntry) bool {
	if (e.Record == nil) != (o.Record == nil) || (e.Tombstone == nil) != (o.Tombstone == nil) || e.FromMasters != o.FromMasters {
		return false
	}
	return (e.Record == nil || e.Record.Equal(o.Record)) && (e.Tombstone == nil || *e.Tombstone == *o.Tombstone)
}

// memberEntries indexes a persisted membership by agent id.
func memberEntries(st membership.State, fromMasters []string) map[string]*memberEntry {
	out := make(map[string]*memberEntry, len(st.Records)+len(st.Tombstones))
	entry := func(id string) *memberEntry {
		e := out[id]
		if e == nil {
			e = &memberEntry{}
			out[id] = e
		}
		return e
	}
	// Copies (as Membership keeps them): what Save compares with must not
	// change with the caller's slices.
	for _, r := range st.Records {
		r.Overlays = slices.Clone(r.Overlays)
		entry(r.ID).Record = &r
	}
	for _, t := range st.Tombstones {
		entry(t.AgentID).Tombstone = &t
	}
	for _, id := range fromMasters {
		if e := out[id]; e != nil {
			e.FromMasters = true
		}
	}
	return out
}

// Store is the agent's persistent state: its id, its last known leases, the
// network configuration, and the membership, so that a restart with every
// master down keeps the dataplane working. Its methods are safe for
// concurrent use.
type Store struct {
	db *bolt.DB
	// mu guards saved: the membership as last written (or loaded), which
	// Save compares with to write only the agent ids that changed.
	mu    sync.Mutex
	saved map[string]*memberEntry
}

// State is what the agent keeps across restarts.
type State struct {
	ID          string
	Self        *api.AgentInfo
	Network     *api.NetworkConfig
	Membership  membership.State
	MasterIndex uint64
	// RestoreEpoch is the masters' restore epoch of MasterIndex (0: none).
	RestoreEpoch uint64
	// RestoreFloor is the highest version the agent knew when it followed
	// the last restore of the masters' table (gossip at or below it that
	// the agent does not hold is of the history before the restore).
	RestoreFloor uint64
	// ClusterID is the masters' cluster all of the above comes from.
	ClusterID string
	// SigningKey is the masters' record-signing key the agent verifies
	// with: pinned from the first master state, or --signing-pub-file's;
	// nil when the masters sign nothing (--insecure).
	SigningKey ed25519.PublicKey
	// FromMasters are the agents whose record in Membership is the
	// masters' copy (see Membership).
	FromMasters []string
	// Horizon is the masters' compaction horizon last seen (membership.Membership.Horizon).
	Horizon uint64
}

// Open opens (or creates) the store in dir; an agent running with that
// dir holds it open, and a second one is refused with an error saying so.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	db, err := bolt.Open(filepath.Join(dir, storeFile), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: another agent holds it (is one already running with this --data-dir?)", filepath.Join(dir, storeFile))
		}
		return nil, fmt.Errorf("open agent store: %w", err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{agentBucket, membersBucket} {
			if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("init agent store: %w", err)
	}
	return &Store{db: db}, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// DB exposes the database, so that the IPAM state can share its transactions.
func (s *Store) DB() *bolt.DB { return s.db }

// LoadOrCreateID returns the persisted agent id, creating one when there is
// none. A fixed id (--id, or the agent certificate's) wins and is persisted;
// changing it later is refused, because leases and container addresses
// belong to the id. from names where the fixed id comes from, for the error.
func (s *Store) LoadOrCreateID(fixed, from string) (string, error) {
	var id string
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(agentBucket))
		cur := string(b.Get([]byte(keyID)))
		switch {
		case cur != "" && fixed != "" && cur != fixed:
			return fmt.Errorf("%s %q differs from the id %q this data dir belongs to (use another --data-dir, or the id %q)", from, fixed, cur, cur)
		case cur != "":
			id = cur
			return nil
		case fixed != "":
			id = fixed
		default:
			var buf [8]byte
			if _, err := rand.Read(buf[:]); err != nil {
				return err
			}
			id = "agent-" + hex.EncodeToString(buf[:])
		}
		return b.Put([]byte(keyID), []byte(id))
	})
	if err != nil {
		return "", fmt.Errorf("agent id: %w", err)
	}
	return id, nil
}

// Load reads the persisted state (zero values when absent).
func (s *Store) Load() (State, error) {
	var p State
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(agentBucket))
		p.ID = string(b.Get([]byte(keyID)))
		if v := b.Get([]byte(keySelf)); v != nil {
			p.Self = &api.AgentInfo{}
			if err := json.Unmarshal(v, p.Self); err != nil {
				return fmt.Errorf("decode persisted self record: %w", err)
			}
		}
		if v := b.Get([]byte(keyNetwork)); v != nil {
			p.Network = &api.NetworkConfig{}
			if err := json.Unmarshal(v, p.Network); err != nil {
				return fmt.Errorf("decode persisted network config: %w", err)
			}
		}
		if err := loadMembers(tx, &p); err != nil {
			return err
		}
		if v := b.Get([]byte(keyIndex)); v != nil {
			if err := json.Unmarshal(v, &p.MasterIndex); err != nil {
				return fmt.Errorf("decode persisted master index: %w", err)
			}
		}
		p.ClusterID = string(b.Get([]byte(keyCluster)))
		if v := b.Get([]byte(keySignKey)); len(v) > 0 {
			key, err := api.ParseSigningKey(string(v))
			if err != nil {
				return fmt.Errorf("decode the pinned signing key: %w", err)
			}
			p.SigningKey = key
		}
		if v := b.Get([]byte(keyEpoch)); v != nil {
			if err := json.Unmarshal(v, &p.RestoreEpoch); err != nil {
				return fmt.Errorf("decode persisted restore epoch: %w", err)
			}
		}
		if v := b.Get([]byte(keyFloor)); v != nil {
			if err := json.Unmarshal(v, &p.RestoreFloor); err != nil {
				return fmt.Errorf("decode persisted restore floor: %w", err)
			}
		}
		if v := b.Get([]byte(keyHorizon)); v != nil {
			if err := json.Unmarshal(v, &p.Horizon); err != nil {
				return fmt.Errorf("decode persisted compaction horizon: %w", err)
			}
		}
		return nil
	})
	if err == nil {
		s.mu.Lock()
		s.saved = memberEntries(p.Membership, p.FromMasters)
		s.mu.Unlock()
	}
	return p, err
}

// loadMembers reads the membership: one entry per agent id, or the whole
// membership in one value as earlier versions wrote it.
func loadMembers(tx *bolt.Tx, p *State) error {
	b := tx.Bucket([]byte(agentBucket))
	if v := b.Get([]byte(keyMembers)); v != nil {
		// Our own disk: no bound but the cluster's size.
		msg, err := membership.DecodeStored(v)
		if err != nil {
			return fmt.Errorf("decode persisted membership: %w", err)
		}
		p.Membership = msg.State
		if v := b.Get([]byte(keyMasters)); v != nil {
			if err := json.Unmarshal(v, &p.FromMasters); err != nil {
				return fmt.Errorf("decode persisted membership origins: %w", err)
			}
		}
		return nil
	}
	return tx.Bucket([]byte(membersBucket)).ForEach(func(k, v []byte) error {
		var e memberEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("decode persisted membership entry %q: %w", k, err)
		}
		if e.Record != nil {
			p.Membership.Records = append(p.Membership.Records, *e.Record)
		}
		if e.Tombstone != nil {
			p.Membership.Tombstones = append(p.Membership.Tombstones, *e.Tombstone)
		}
		if e.FromMasters {
			p.FromMasters = append(p.FromMasters, string(k))
		}
		return nil
	})
}

// Save writes the state in one transaction (fsynced on commit): of the
// membership, only the agent ids whose record, tombstone or origin changed
// since the last Save (a change costs what it is, not the cluster's size).
// A nil own record or network configuration is deleted: after a rebuild of
// the masters' cluster the old ones must not come back on restart.
func (s *Store) Save(p State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries := memberEntries(p.Membership, p.FromMasters)
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := saveMembers(tx, s.saved, entries); err != nil {
			return err
		}
		b := tx.Bucket([]byte(agentBucket))
		put := func(key string, v any) error {
			if v == nil {
				return b.Delete([]byte(key))
			}
			data, err := json.Marshal(v)
			if err != nil {
				return fmt.Errorf("encode %s: %w", key, err)
			}
			return b.Put([]byte(key), data)
		}
		var self, network any
		if p.Self != nil {
			self = p.Self
		}
		if p.Network != nil {
			network = p.Network
		}
		for _, kv := range []struct {
			key string
			v   any
		}{{keySelf, self}, {keyNetwork, network}, {keyIndex, p.MasterIndex}, {keyEpoch, p.RestoreEpoch}, {keyFloor, p.RestoreFloor}, {keyHorizon, p.Horizon}} {
			if err := put(kv.key, kv.v); err != nil {
				return err
			}
		}
		if p.SigningKey == nil {
			// A rebuilt cluster whose masters sign nothing (--insecure).
			if err := b.Delete([]byte(keySignKey)); err != nil {
				return err
			}
		} else if err := b.Put([]byte(keySignKey), []byte(api.EncodeSigningKey(p.SigningKey))); err != nil {
			return err
		}
		return b.Put([]byte(keyCluster), []byte(p.ClusterID))
	})
	if err == nil {
		s.saved = entries
	}
	return err
}

// saveMembers writes the entries that differ from saved and deletes those
// that are gone; the whole-membership values of earlier versions are
// replaced by the entries.
func saveMembers(tx *bolt.Tx, saved, entries map[string]*memberEntry) error {
	b := tx.Bucket([]byte(agentBucket))
	if b.Get([]byte(keyMembers)) != nil {
		saved = nil // written by an earlier version: write every entry
		for _, k := range []string{keyMembers, keyMasters} {
			if err := b.Delete([]byte(k)); err != nil {
				return err
			}
		}
	}
	mb := tx.Bucket([]byte(membersBucket))
	if saved == nil {
		// Nothing known of what is on disk: the entries are all of it.
		var stale [][]byte
		if err := mb.ForEach(func(k, _ []byte) error {
			if _, ok := entries[string(k)]; !ok {
				stale = append(stale, slices.Clone(k))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range stale {
			if err := mb.Delete(k); err != nil {
				return err
			}
		}
	}
	// In key order: bbolt inserts into a node's sorted slice, and keys in
	// random (map) order make a first save of n members cost n² moves
	// (seconds at 80k members, minutes under the race detector).
	for _, id := range slices.Sorted(maps.Keys(entries)) {
		e := entries[id]
		if old, ok := saved[id]; ok && old.equal(e) {
			continue
		}
		data, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode membership entry %q: %w", id, err)
		}
		if err := mb.Put([]byte(id), data); err != nil {
			return err
		}
	}
	for id := range saved {
		if _, ok := entries[id]; !ok {
			if err := mb.Delete([]byte(id)); err != nil {
				return err
			}
		}
	}
	return nil
}
