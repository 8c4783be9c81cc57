package state

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"github.com/carve-net/carve/api"
)

// stateCache keeps each agent's rendered (and signed) JSON, keyed by record
// pointer, and each tombstone's, keyed by version, so that a state read at
// 10,000 agents re-renders and re-signs only what changed.
type stateCache struct {
	mu         sync.Mutex
	agents     map[string]cachedAgent
	tombstones map[string]cachedTombstone
	// full is the encoded agents+tombstones part for fullIndex and the
	// usage generations it shows (fullUsage).
	full      []byte
	fullIndex uint64
	fullUsage uint64
	fullValid bool
	// body is the whole answer of the last state read, shared by every
	// reader of the same index and leader (immutable once built).
	body *StateBody
	// changes are the encoded answers of GET /overlay-master/changes by
	// since, for changesKey: every watcher at the same since shares one
	// encoding (immutable once built).
	changes    map[uint64]*StateBody
	changesKey changesKey
	// rounds gates the changes watchers' answers (rounds.go); a reset
	// makes a new one, and the old one still releases its waiters.
	rounds *roundGate
}

// changesKey is what a changes answer depends on besides since: the state
// index (records, tombstones, horizon, revocations and restore change only
// with it), the usage generation (usage reports change records' encodings
// between indexes) and the signing generation (a new key re-signs all).
type changesKey struct{ index, usage, signing uint64 }

// maxSharedChanges bounds the encoded changes answers kept for one
// changesKey: watchers sit at few distinct indexes (those of recent
// changes), so a few hundred cover a burst; beyond it an answer is
// encoded for its watcher alone.
const maxSharedChanges = 512

// StateBody is one encoded state answer (or changes answer, see
// ChangesBody), and its gzip encoding made at the first reader that
// accepts it. Immutable, shared by every reader of the same answer.
type StateBody struct {
	index  uint64
	leader string
	usage  uint64 // the usage generation it shows
	data   []byte
	gzOnce sync.Once
	gz     []byte
	// etag, made once, names the body for conditional reads.
	etagOnce sync.Once
	etag     string
}

// ETag is the body's entity tag: weak, because the gzip'ed and the plain
// answers are the same state, and a hash of the body, because the body
// changes with the index, the leader and the agents' usage reports.
func (b *StateBody) ETag() string {
	b.etagOnce.Do(func() {
		sum := sha256.Sum256(b.data)
		b.etag = `W/"` + hex.EncodeToString(sum[:12]) + `"`
	})
	return b.etag
}

// stateGzipLevel is the compression of the gzip'ed state. Every read
// pays for its bytes (TLS encryption and the kernel's copies on both ends)
// while the compression is paid once per index: at 10,000 agents level 5
// makes the body 9% smaller than BestSpeed (1.10 MB against 1.21 MB) for
// about the same time (28 ms against 24 ms); higher levels gain under 2%
// more for up to four times the time, which registration churn would pay
// at every index.
const stateGzipLevel = 5

// Index is the state index the body shows.
func (b *StateBody) Index() uint64 { return b.index }

// Data is the encoded state (api.State with the leader); not to be changed.
func (b *StateBody) Data() []byte { return b.data }

// Gzipped returns the body gzip'ed, made once, by the first reader that
// asks for it.
func (b *StateBody) Gzipped() []byte {
	b.gzOnce.Do(func() {
		var buf bytes.Buffer
		buf.Grow(len(b.data) / 4)
		zw, _ := gzip.NewWriterLevel(&buf, stateGzipLevel) // a valid level: no error
		_, _ = zw.Write(b.data)                            // a bytes.Buffer does not fail
		_ = zw.Close()
		b.gz = buf.Bytes()
	})
	return b.gz
}

type cachedAgent struct {
	rec      *agentRecord
	usageGen uint64
	data     []byte
}

type cachedTombstone struct {
	version uint64
	data    []byte
}

func newStateCache() stateCache {
	return stateCache{agents: map[string]cachedAgent{}, tombstones: map[string]cachedTombstone{}, rounds: &roundGate{}}
}

// invalidate drops every cached encoding (what they render changed: the
// network configuration, the cluster id or the signing key); the caller
// holds c.mu or owns the table exclusively.
func (c *stateCache) invalidate() {
	c.agents = map[string]cachedAgent{}
	c.tombstones = map[string]cachedTombstone{}
	c.fullValid = false
	c.body = nil
	c.changes = nil
}

// StateJSON encodes the state, reusing the encodings of unchanged records,
// and returns it with its index: both come from the same instant, so an
// answer's index header and its body never disagree. leader is the current
// leader's id (not part of the replicated state).
func (t *LeaseTable) StateJSON(leader string) ([]byte, uint64, error) {
	b, err := t.StateBody(leader)
	if err != nil {
		return nil, 0, err
	}
	return b.data, b.index, nil
}

// StateBody returns the encoded state, built once per index and leader and
// shared by every reader: a read at 10,000 agents costs a write of the
// bytes, not an encoding.
func (t *LeaseTable) StateBody(leader string) (*StateBody, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.cache.mu.Lock()
	defer t.cache.mu.Unlock()
	usage := t.usage.Generation()
	if b := t.cache.body; b != nil && b.index == t.stateIndex && b.leader == leader && b.usage == usage {
		return b, nil
	}
	data, err := t.encodeState(leader, usage)
	if err != nil {
		return nil, err
	}
	t.cache.body = &StateBody{index: t.stateIndex, leader: leader, usage: usage, data: data}
	return t.cache.body, nil
}

// encodeState encodes the whole state with the usage generation usage;
// the caller holds t.mu (read) and t.cache.mu.
func (t *LeaseTable) encodeState(leader string, usage uint64) ([]byte, error) {
	if !t.cache.fullValid || t.cache.fullIndex != t.stateIndex || t.cache.fullUsage != usage {
		full, err := t.encodeAgentsAndTombstones()
		if err != nil {
			return nil, err
		}
		t.cache.full, t.cache.fullIndex, t.cache.fullUsage, t.cache.fullValid = full, t.stateIndex, usage, true
	}
	var out bytes.Buffer
	netJSON := []byte("{}")
	if t.net != nil {
		var err error
		if netJSON, err = json.Marshal(t.net.Config()); err != nil {
			return nil, fmt.Errorf("encode network: %w", err)
		}
	}
	out.Grow(len(t.cache.full) + len(netJSON) + 128)
	out.WriteString(`{"network":`)
	out.Write(netJSON)
	out.WriteString(`,"index":`)
	out.WriteString(strconv.FormatUint(t.stateIndex, 10))
	writeJSONField(&out, "cluster_id", t.clusterID)
	writeJSONField(&out, "leader", leader)
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
	out.Write(t.cache.full)
	out.WriteString("}\n")
	return out.Bytes(), nil
}

// writeJSONField appends `,"name":"value"` when value is not empty.
func writeJSONField(out *bytes.Buffer, name, value string) {
	if value == "" {
		return
	}
	v, _ := json.Marshal(value)
	out.WriteString(`,"` + name + `":`)
	out.Write(v)
}

// parallelEncodeMin is the number of records to encode from which the
// work is spread over the CPUs: signing (~25µs a record) makes a first read
// after a restart or a configuration change take a quarter second per
// 10,000 agents on one core.
const parallelEncodeMin = 64

// encodeChangedAgents renders, signs and encodes into the cache the records
// of ids whose cached encoding is missing or stale; the caller holds t.mu
// (read) and t.cache.mu.
func (t *LeaseTable) encodeChangedAgents(ids []string) error {
	var stale []string
	for _, id := range ids {
		rec := t.agents[id]
		if c, ok := t.cache.agents[id]; !ok || c.rec != rec || c.usageGen != t.usage.AgentGeneration(id, rec.Created) {
			stale = append(stale, id)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	encoded := make([]cachedAgent, len(stale))
	errs := make([]error, len(stale))
	encode := func(i int) {
		rec := t.agents[stale[i]]
		gen := t.usage.AgentGeneration(rec.ID, rec.Created)
		info := t.render(rec)
		t.signer.SignAgent(info, t.clusterID)
		t.usage.Fill(info, rec.Created)
		data, err := json.Marshal(info)
		if err != nil {
			errs[i] = fmt.Errorf("encode agent %s: %w", stale[i], err)
		}
		encoded[i] = cachedAgent{rec: rec, usageGen: gen, data: data}
	}
	workers := min(runtime.GOMAXPROCS(0), len(stale)/parallelEncodeMin+1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(stale); i += workers {
				encode(i)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, id := range stale {
		t.cache.agents[id] = encoded[i]
	}
	return nil
}

// encodeTombstone returns the signed encoding of id's tombstone, cached by
// version; the caller holds t.mu (read) and t.cache.mu.
func (t *LeaseTable) encodeTombstone(id string) ([]byte, error) {
	version := t.tombstones[id]
	c, ok := t.cache.tombstones[id]
	if !ok || c.version != version {
		tb := api.Tombstone{AgentID: id, Version: version}
		t.signer.SignTombstone(&tb, t.clusterID)
		data, err := json.Marshal(tb)
		if err != nil {
			return nil, fmt.Errorf("encode tombstone %s: %w", id, err)
		}
		c = cachedTombstone{version: version, data: data}
		t.cache.tombstones[id] = c
	}
	return c.data, nil
}

// encodeAgentsAndTombstones renders the agents and tombstones part of the
// state, re-encoding only the records that changed since the last call; the
// caller holds t.mu (read) and t.cache.mu.
func (t *LeaseTable) encodeAgentsAndTombstones() ([]byte, error) {
	var buf bytes.Buffer
	ids := slices.Sorted(maps.Keys(t.agents))
	if err := t.encodeChangedAgents(ids); err != nil {
		return nil, err
	}
	if len(ids) > 0 {
		buf.WriteString(`,"agents":[`)
		for i, id := range ids {
			if i > 0 {
				buf.WriteByte(',')
			}
			buf.Write(t.cache.agents[id].data)
		}
		buf.WriteString(`]`)
	}
	if len(t.tombstones) > 0 {
		buf.WriteString(`,"tombstones":[`)
		for i, id := range slices.Sorted(maps.Keys(t.tombstones)) {
			if i > 0 {
				buf.WriteByte(',')
			}
			data, err := t.encodeTombstone(id)
			if err != nil {
				return nil, err
			}
			buf.Write(data)
		}
		buf.WriteString(`]`)
	}
	if q := t.quarantineAPI(); len(q) > 0 {
		data, err := json.Marshal(q)
		if err != nil {
			return nil, fmt.Errorf("encode quarantine: %w", err)
		}
		buf.WriteString(`,"quarantine":`)
		buf.Write(data)
	}
	for id := range t.cache.agents {
		if _, ok := t.agents[id]; !ok {
			delete(t.cache.agents, id)
		}
	}
	for id := range t.cache.tombstones {
		if _, ok := t.tombstones[id]; !ok {
			delete(t.cache.tombstones, id)
		}
	}
	t.signer.Prune(func(id string) bool { return t.agents[id] != nil }, func(id string) bool {
		_, ok := t.tombstones[id]
		return ok
	})
	return buf.Bytes(), nil
}
