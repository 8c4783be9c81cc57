package state

import (
	"crypto/sha256"
	"encoding/binary"
)

// maxRequestIDs is how many recent request ids are remembered so that a
// retry after an unknown outcome has one effect. Pruned first in, first out,
// which is deterministic on every replica.
const maxRequestIDs = 100_000

// requestOutcome is what one request did, kept so that a retry of it (the
// same request id, after an unknown outcome) is answered with that request's
// own effect, whatever happened to the agent since.
type requestOutcome struct {
	Index  uint64 // log index that applied the request
	Op     string
	Digest string // commandDigest of the request; "" when restored from a format 1 snapshot
	// Agent is the record a registration left (records are immutable).
	Agent *agentRecord
	// Deleted are the agents a delete removed.
	Deleted []string
}

// requestTable remembers the outcomes of the last maxRequestIDs requests.
type requestTable struct {
	byID  map[string]requestOutcome
	order []string // ids, oldest first, for pruning
	// sum is the XOR of requestHash over the remembered requests: their
	// part of the state digest, kept as they come and go.
	sum [sha256.Size]byte
}

// requestHash is what one remembered request adds to the state digest.
func requestHash(id string, o requestOutcome) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, s := range []string{id, o.Op, o.Digest} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	binary.BigEndian.PutUint64(n[:], o.Index)
	h.Write(n[:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// xor folds a request hash into (or out of) the table's sum.
func (r *requestTable) xor(s [sha256.Size]byte) {
	for i := range r.sum {
		r.sum[i] ^= s[i]
	}
}

func newRequestTable() requestTable {
	return requestTable{byID: map[string]requestOutcome{}}
}

func (r *requestTable) known(id string) bool {
	_, ok := r.byID[id]
	return ok
}

func (r *requestTable) lookup(id string) (requestOutcome, bool) {
	o, ok := r.byID[id]
	return o, ok
}

// remember records the outcome of a request id not seen before, and forgets
// the oldest ones beyond maxRequestIDs.
func (r *requestTable) remember(id string, o requestOutcome) {
	r.byID[id] = o
	r.xor(requestHash(id, o))
	r.order = append(r.order, id)
	if drop := len(r.order) - maxRequestIDs; drop > 0 {
		for _, old := range r.order[:drop] {
			r.xor(requestHash(old, r.byID[old]))
			delete(r.byID, old)
		}
		// Reslicing is amortised O(1): append moves the live part to a new
		// array when it runs out of room, and the old one is collected.
		r.order = r.order[drop:]
	}
}
