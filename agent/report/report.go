// Package report is an agent's configuration result as it reports it to
// the masters (PUT /overlay-master/agents/{id}/report, carve cluster
// status): the agent notes a result after each reconcile, and Run sends
// the latest when it says something new, retrying with backoff; a newer
// result replaces one not sent yet, and the reconcile never waits on the
// masters. What is news is decided here (sameResult): not a count that
// only grew, which every join would write on every agent.
package report

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
)

// sendTimeout bounds one report call to the masters.
const sendTimeout = 15 * time.Second

// Reporter holds the agent's configuration result, as it reports it to the
// masters: after each reconcile the agent notes it, and Run sends it when
// it changed. Its methods are safe for concurrent use.
type Reporter struct {
	mu sync.Mutex
	// attempts counts the reconciles of the record version attemptsFor.
	attempts    uint32
	attemptsFor uint64
	// want is the latest result; sent the last one the masters acknowledged.
	want, sent *api.ReportRequest
	// peak is the most peers a reconcile programmed (sameResult).
	peak int
	// meshPassword and meshAccepted are the fingerprints of the mesh
	// passwords the agent sends with and accepts besides
	// (api.MeshPasswordFingerprint), carried by every result (SetMesh).
	meshPassword, meshAccepted string
	wake                       chan struct{}
}

// New returns a Reporter with no result yet.
func New() *Reporter { return &Reporter{wake: make(chan struct{}, 1)} }

// sameResult tells whether two reports say the same (attempts and request
// ids aside: a change of the count alone is not worth a Raft write). Of
// the programmed peers, only a fall is news, or a rise back towards the
// most the agent held (peak): a report of an older index is never judged
// short for what came after it (state.LeaseTable.AgentTrust), so a rise
// that every join brings is not worth a write on every agent.
func sameResult(x, y *api.ReportRequest, peak int) bool {
	if x == nil || y == nil || x.Version != y.Version || !slices.Equal(x.Overlays, y.Overlays) ||
		x.SigningKey != y.SigningKey || x.Refusing != y.Refusing || (x.ProgrammedPeers == nil) != (y.ProgrammedPeers == nil) ||
		x.MeshPassword != y.MeshPassword || x.MeshAccepted != y.MeshAccepted {
		return false
	}
	if x.ProgrammedPeers == nil {
		return true
	}
	next, was := *x.ProgrammedPeers, *y.ProgrammedPeers
	return next == was || (next > was && was >= peak)
}

// Note records the result of a reconcile of the record at next.Version
// (attempts, request id and mesh fingerprints are the Reporter's to set),
// to be sent when it says something new.
func (r *Reporter) Note(next api.ReportRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if next.Version != r.attemptsFor {
		r.attempts, r.attemptsFor = 0, next.Version
	}
	r.attempts++
	next.ConfigurationAttempts = r.attempts
	next.MeshPassword, next.MeshAccepted = r.meshPassword, r.meshAccepted
	same := sameResult(&next, r.want, r.peak)
	if next.ProgrammedPeers != nil {
		r.peak = max(r.peak, *next.ProgrammedPeers)
	}
	if same {
		return
	}
	r.replace(&next)
}

// SetMesh records the fingerprints of the mesh passwords the agent now
// sends with and accepts besides; when they changed, the last result is
// sent again with them (the operator's check of a round of a mesh
// password change waits for it), without waiting for a reconcile.
func (r *Reporter) SetMesh(password, accepted string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.meshPassword == password && r.meshAccepted == accepted {
		return
	}
	r.meshPassword, r.meshAccepted = password, accepted
	if r.want == nil {
		return // the first result carries them
	}
	next := *r.want
	next.MeshPassword, next.MeshAccepted = password, accepted
	r.replace(&next)
}

// replace makes next the result to send, under a request id of its own
// (kept across its retries), and wakes Run. The caller holds r.mu.
func (r *Reporter) replace(next *api.ReportRequest) {
	next.RequestID = api.NewRequestID()
	r.want = next
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// ConfigurationAttempts is the count of reconciles of the record version.
func (r *Reporter) ConfigurationAttempts(version uint64) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if version != r.attemptsFor {
		return 0
	}
	return r.attempts
}

// pending is the result to send, or nil when the masters have it.
func (r *Reporter) pending() *api.ReportRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.want == nil || (r.sent != nil && r.want.RequestID == r.sent.RequestID) {
		return nil
	}
	c := *r.want
	return &c
}

// acknowledged records req as the result the masters have.
func (r *Reporter) acknowledged(req *api.ReportRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = req
}

// Run sends the result to the masters with send whenever it changed, until
// ctx ends; a failed send is retried after b's next wait, with the latest
// result then. send logs and counts its answers.
func (r *Reporter) Run(ctx context.Context, b retry.Backoff, send func(context.Context, api.ReportRequest) error) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		for ctx.Err() == nil {
			req := r.pending()
			if req == nil {
				b.Reset()
				break
			}
			cctx, cancel := context.WithTimeout(ctx, sendTimeout)
			err := send(cctx, *req)
			cancel()
			if err == nil {
				r.acknowledged(req)
				continue
			}
			if !retry.Sleep(ctx, b.Next()) {
				return
			}
		}
	}
}
