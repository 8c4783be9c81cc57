package agent

// The changes stream: one request for as long as it lives, a frame per
// change (apiclient.ChangeStream), judged and merged as the long poll's answers.

import (
	"context"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
)

const (
	// streamRetryAfter: after masters answered that they serve no stream
	// (an older release), the agent long-polls this long before it tries
	// the stream again (they may have been upgraded).
	streamRetryAfter = 10 * time.Minute
	// streamSteady: a stream that lived this long before it ended is
	// opened again at once; one that ended sooner after a backoff step, so
	// that masters (or a proxy) that end every stream as it begins are not
	// asked in a loop.
	streamSteady = time.Second
)

// streamOutcome is how a followed changes stream ended.
type streamOutcome struct {
	frames int           // changes frames applied
	full   bool          // the whole state is to be read (410, another cluster, restore, key, a refusal)
	lived  time.Duration // from its opening to its end
}

// streamHeartbeat is the heartbeat the agent asks of the masters: half
// its long poll's wait, so that a dead master is noticed (three missed
// heartbeats) about when a long poll would have failed.
func (a *Agent) streamHeartbeat() time.Duration {
	return min(max(a.cfg.WatchWait/2, api.MinStreamHeartbeat), api.MaxStreamHeartbeat)
}

// followStream follows a changes stream from since until it ends: each
// frame is judged (changesNeedFull) and merged as a long poll's answer
// is. The error is why it ended (nil when the outcome says: the whole
// state is to be read, or a frame was not applied, which
// applyMasterState logged); one wrapping apiclient.ErrStreamUnsupported when
// the masters serve no stream.
func (a *Agent) followStream(ctx context.Context, since uint64) (streamOutcome, error) {
	opened := time.Now()
	var out streamOutcome
	s, err := a.client.StreamChanges(ctx, since, apiclient.StreamOptions{Heartbeat: a.streamHeartbeat()})
	if err != nil {
		if why, args := changesNeedFull(nil, err, "", "", 0); why != "" && api.IsCode(err, api.CodeGone) {
			a.metrics.masterReads.WithLabelValues("gone").Inc()
			a.log.Info(why, args...)
			out.full = true
			return out, nil
		}
		return out, err
	}
	defer s.Close()
	for {
		ch, err := s.Next()
		out.lived = time.Since(opened)
		a.mu.RLock()
		cluster, stateKey, epoch := a.clusterID, a.stateKey, a.restoreEpoch
		a.mu.RUnlock()
		if why, args := changesNeedFull(ch, err, cluster, stateKey, epoch); why != "" {
			if err != nil {
				a.metrics.masterReads.WithLabelValues("gone").Inc()
			}
			a.log.Info(why, append(args, "master", s.Master())...)
			out.full = true
			return out, nil
		}
		if err != nil {
			return out, err
		}
		a.metrics.masterReads.WithLabelValues("changes").Inc()
		if !a.applyMasterState(changesState(ch), false) {
			return out, nil
		}
		out.frames++
		a.setReachable(true)
		// While it refuses records of the masters' state, the agent reads
		// it whole: only a whole state that verifies ends the refusal.
		if a.refusingNow() != "" {
			out.full = true
			return out, nil
		}
	}
}
