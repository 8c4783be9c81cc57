package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

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
	keyMembers  = "membership"
	keyIndex    = "master_index"
	keyCluster  = "cluster_id"
	keySignKey  = "signing_key"
	keyMasters  = "membership_from_masters"
	keyHorizon  = "horizon"
)

// Store is the agent's persistent state: its id, its last known leases, the
// network configuration, and the membership, so that a restart with every
// master down keeps the dataplane working.
type Store struct {
	db *bolt.DB
}

// persisted is what the agent keeps across restarts.
type persisted struct {
	ID          string
	Self        *api.AgentInfo
	Network     *api.NetworkConfig
	Membership  MembershipState
	MasterIndex uint64
	// ClusterID is the masters' cluster all of the above comes from.
	ClusterID string
	// SigningKey is the masters' record-signing key the agent verifies
	// with: pinned from the first master state, or --signing-pub-file's;
	// nil when the masters sign nothing (--insecure).
	SigningKey ed25519.PublicKey
	// FromMasters are the agents whose record in Membership is the
	// masters' copy (see Membership).
	FromMasters []string
	// Horizon is the masters' compaction horizon last seen (horizon.go).
	Horizon uint64
}

// OpenStore opens (or creates) the store in dir.
func OpenStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	db, err := bolt.Open(filepath.Join(dir, storeFile), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open %s: another agent holds it (is one already running with this --data-dir?)", filepath.Join(dir, storeFile))
		}
		return nil, fmt.Errorf("open agent store: %w", err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte(agentBucket))
		return err
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
func (s *Store) Load() (persisted, error) {
	var p persisted
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
		if v := b.Get([]byte(keyMembers)); v != nil {
			// Our own disk: no bound but the cluster's size.
			msg, err := decodeMembership(v)
			if err != nil {
				return fmt.Errorf("decode persisted membership: %w", err)
			}
			p.Membership = msg.MembershipState
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
		if v := b.Get([]byte(keyMasters)); v != nil {
			if err := json.Unmarshal(v, &p.FromMasters); err != nil {
				return fmt.Errorf("decode persisted membership origins: %w", err)
			}
		}
		if v := b.Get([]byte(keyHorizon)); v != nil {
			if err := json.Unmarshal(v, &p.Horizon); err != nil {
				return fmt.Errorf("decode persisted compaction horizon: %w", err)
			}
		}
		return nil
	})
	return p, err
}

// Save writes the state in one transaction (fsynced on commit). A nil own
// record or network configuration is deleted: after a rebuild of the
// masters' cluster the old ones must not come back on restart.
func (s *Store) Save(p persisted) error {
	return s.db.Update(func(tx *bolt.Tx) error {
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
		}{{keySelf, self}, {keyNetwork, network}, {keyMembers, p.Membership}, {keyIndex, p.MasterIndex}, {keyMasters, p.FromMasters}, {keyHorizon, p.Horizon}} {
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
}
