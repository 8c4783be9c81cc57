package agent

// The watch of the masters' state: whole, then its changes, and how a
// state read is judged and merged.

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
)

// watchLoop follows the masters' state: one whole state first, then only
// what changes, which costs a watcher what a change is, not what the
// cluster is: over one stream (GET /overlay-master/changes/stream,
// watchstream.go), or, from masters without it (404: a release before
// it), long polls (GET /overlay-master/changes), one request per change.
// It reads the whole state again when the masters no longer keep the
// changes since its index (410: it was away longer than the change log or
// the tombstone horizon reach), when the cluster id changes (a rebuild),
// or when a master has no changes route (an older version).
//
// The first read, and the next after a read that failed or was not
// applied, does not wait (a probe): masters at the index the agent already
// has (from its data dir after a restart, or when they come back) would
// otherwise hold a long poll for WatchWait before the agent learns that
// they answer, and it would report them unreachable meanwhile.
func (a *Agent) watchLoop(ctx context.Context) {
	b := retry.Backoff{First: firstRetry, Max: maxWatchRetry}
	full, probe := true, true
	explained := "" // the last explained failure, said once as an error
	// Until then the changes are long-polled: the masters answered that
	// they serve no stream (an older release).
	var longPollUntil time.Time
	for ctx.Err() == nil {
		a.mu.RLock()
		index, cluster, stateKey, epoch := a.masterIndex, a.clusterID, a.stateKey, a.restoreEpoch
		a.mu.RUnlock()
		wait := a.cfg.WatchWait
		if probe {
			wait = 0
		}
		var err error
		applied := false
		if full {
			var st *api.State
			st, err = a.client.State(ctx, apiclient.StateOptions{Index: index, Wait: wait})
			if err == nil {
				a.metrics.masterReads.WithLabelValues("state").Inc()
				applied = a.applyMasterState(st, true)
				full = !applied
			}
		} else if time.Now().After(longPollUntil) {
			out, serr := a.followStream(ctx, index)
			switch {
			case errors.Is(serr, apiclient.ErrStreamUnsupported):
				a.log.Info("the masters serve no changes stream (a release before it): watching with the long poll", "err", serr, "stream_again_in", streamRetryAfter)
				longPollUntil = time.Now().Add(streamRetryAfter)
				continue // the long poll now
			case out.frames == 0 && errors.Is(serr, apiclient.ErrStreamIdle):
				// The master sends a stream's first frame at once: none in
				// three heartbeats is something between that holds the
				// answer back (a buffering proxy), or a master that hangs.
				a.log.Warn("no frame came on the changes stream (a proxy that buffers answers, or a master that hangs): watching with the long poll", "err", serr, "stream_again_in", streamRetryAfter)
				longPollUntil = time.Now().Add(streamRetryAfter)
				continue
			case out.full:
				full, probe = true, true // the whole state now, not after a long poll
				continue
			case out.frames > 0:
				// The stream was followed, then ended (the master dropped
				// it, stopped, or went silent): opened again from the
				// index applied, at once if it lived, after a backoff step
				// if it ended as it began (not in a loop).
				a.setReachable(true)
				probe, explained = false, ""
				full = a.refusingNow() != ""
				a.log.Debug("the changes stream ended: opening it again", "err", serr, "frames", out.frames, "lived", out.lived)
				if out.lived >= streamSteady {
					b.Reset()
					continue
				}
				if !retry.Sleep(ctx, b.Next()) {
					return
				}
				continue
			}
			err = serr
		} else {
			var ch *api.Changes
			ch, err = a.client.Changes(ctx, index, wait)
			switch why, args := changesNeedFull(ch, err, cluster, stateKey, epoch); {
			case why != "":
				if api.IsCode(err, api.CodeGone) || api.IsCode(err, api.CodeNotFound) {
					a.metrics.masterReads.WithLabelValues("gone").Inc()
				}
				a.log.Info(why, append(args, "index", index)...)
				full, probe = true, true // the whole state now, not after a long poll
				continue
			case err == nil:
				a.metrics.masterReads.WithLabelValues("changes").Inc()
				applied = a.applyMasterState(changesState(ch), false)
			}
		}
		if applied {
			b.Reset()
			a.setReachable(true)
			probe, explained = false, ""
			// While it refuses records of the masters' state, the agent
			// reads it whole (a long poll): only a whole state that
			// verifies ends the refusal (verify.go).
			full = a.refusingNow() != ""
			continue
		}
		// A stale master counts as none: gossip and the disk are better.
		a.setReachable(false)
		probe = true
		retryIn := b.Next()
		switch why := explainMasterError(err, a.cfg.TLS); {
		case err == nil:
		case why != "" && why != explained:
			// A refusal retrying does not fix (a revoked certificate, a
			// TLS mismatch): the operator must, so it is said as an error,
			// once. The watch may be the only request that meets it: a
			// registered agent otherwise writes only when its kernel's
			// configuration changes (a report).
			explained = why
			a.log.Error("reading the masters' state failed: "+why+"; working from the last known state", "err", err, "retry_in", retryIn)
		default:
			a.log.Debug("state watch failed", "err", err, "retry_in", retryIn)
		}
		if !retry.Sleep(ctx, retryIn) {
			return
		}
	}
}

// changesNeedFull says why a changes answer (or its error) is not merged
// but the whole state read instead, with the log's fields; "" to merge it
// (or, with err set, to retry). It judges the long poll's answers and the
// stream's frames alike.
func changesNeedFull(ch *api.Changes, err error, cluster, stateKey string, epoch uint64) (string, []any) {
	switch {
	case api.IsCode(err, api.CodeGone), api.IsCode(err, api.CodeNotFound):
		return "reading the whole state: the masters do not serve the changes since this agent's index", []any{"err", err}
	case err != nil:
		return "", nil
	case ch.ClusterID != cluster:
		return "the changes are of another cluster: reading the whole state", []any{"cluster_id", ch.ClusterID, "was", cluster}
	case ch.Restore.RestoreEpoch() != epoch:
		return "the changes are of another restore of the masters' table: reading the whole state", []any{"epoch", ch.Restore.RestoreEpoch(), "was", epoch}
	case ch.SigningKey != stateKey:
		return "the masters sign with another key: reading the whole state, re-signed", []any{"key", ch.SigningKey, "was", stateKey}
	}
	return "", nil
}

// changesState is a changes answer as a (partial) state: without a
// network configuration when it did not change (networkFrom keeps the
// known one).
func changesState(ch *api.Changes) *api.State {
	st := &api.State{Index: ch.Index, ClusterID: ch.ClusterID, SigningKey: ch.SigningKey, Horizon: ch.Horizon,
		Agents: ch.Agents, Tombstones: ch.Tombstones, SigningChain: ch.SigningChain, Revoked: ch.Revoked, Restore: ch.Restore}
	if ch.Network != nil {
		st.Network = *ch.Network
	}
	return st
}

func (a *Agent) setReachable(ok bool) {
	a.mu.Lock()
	a.mastersReachable = ok
	a.mu.Unlock()
	v := 0.0
	if ok {
		v = 1
	}
	a.metrics.mastersReachable.Set(v)
}

// stateVerdict is what a state read from a master means to an agent.
type stateVerdict int

const (
	// stateCurrent: the agent's cluster, at or past what the agent saw.
	stateCurrent stateVerdict = iota
	// stateStale: a master of the agent's cluster that is behind what the
	// agent saw (restarted alone, cut off from the others): ignored.
	stateStale
	// stateRebuilt: another cluster; the masters were rebuilt from nothing.
	stateRebuilt
	// stateRestored: the agent's cluster, restored from a snapshot since
	// the agent last read it (a higher restore epoch): its index may be
	// lower, and it replaces what the agent knew.
	stateRestored
)

// judgeState tells what st means to an agent that last applied index of
// cluster clusterID at restore epoch epoch. Only a cluster id that differs
// from a known one proves a rebuild. Within a cluster the restore epoch
// comes first: a higher one is a restore to follow (whatever its index), a
// lower one a master that missed the restore. At the same epoch, a lower
// index is a master that is behind: taking its state would take back what
// the agent knows, peers and leases alike.
func judgeState(clusterID string, epoch, index uint64, st *api.State) stateVerdict {
	switch e := st.Restore.RestoreEpoch(); {
	case clusterID != "" && st.ClusterID != "" && st.ClusterID != clusterID:
		return stateRebuilt
	case e < epoch:
		return stateStale
	case e > epoch && clusterID != "":
		return stateRestored
	case st.Index < index:
		return stateStale
	}
	return stateCurrent
}

// networkFrom is the network configuration to hold after a master's state
// with configuration st, and whether it changed: st, except that an empty
// configuration never replaces a known one (a rebuilt cluster, which may
// have none yet, resets cur to nil first).
func networkFrom(cur *api.NetworkConfig, st api.NetworkConfig) (*api.NetworkConfig, bool) {
	if cur != nil && (jsonEqual(*cur, st) || reflect.ValueOf(st).IsZero()) {
		return cur, false
	}
	return &st, true
}

// applyMasterState merges a state read from the masters, whole (full) or
// the changes since the agent's index; false means it was ignored (a stale
// master, or a state whose signing key is refused). Only a whole state
// drops the records the masters no longer hold (at or below their
// compaction horizon: see membership.Membership.SyncWithMasters); changes hold only
// what changed.
func (a *Agent) applyMasterState(st *api.State, full bool) bool {
	a.mu.Lock()
	verdict := judgeState(a.clusterID, a.restoreEpoch, a.masterIndex, st)
	if verdict == stateStale {
		seen, warned := a.masterIndex, a.staleWarned
		a.staleWarned = true
		a.mu.Unlock()
		a.metrics.staleStates.Inc()
		level := slog.LevelWarn
		if warned {
			level = slog.LevelDebug
		}
		a.log.Log(context.Background(), level, "ignoring the state of a master that is behind: keeping the last known state",
			"index", st.Index, "seen", seen, "cluster_id", st.ClusterID, "restore_epoch", st.Restore.RestoreEpoch(), "seen_epoch", a.restoreEpoch)
		return false
	}
	key, err := keyAfter(a.cfg.SigningKey, a.signingKey, st, verdict == stateRebuilt, a.sec.client == nil)
	if err == nil && verdict == stateRestored {
		err = verifyRestore(key, st)
	}
	if err != nil {
		warned := a.keyWarned
		a.keyWarned = true
		a.mu.Unlock()
		reason := stateRefusedKey
		if errors.Is(err, errStateUnsigned) {
			reason = stateRefusedUnsigned
		}
		a.metrics.statesRefused.WithLabelValues(reason).Inc()
		a.setRefusing(err.Error())
		// The operator must act: said as an error the first time, then
		// quietly while the masters keep answering so.
		level := slog.LevelError
		if warned {
			level = slog.LevelDebug
		}
		a.log.Log(context.Background(), level, err.Error()+"; keeping the last known state", "index", st.Index, "cluster_id", st.ClusterID)
		return false
	}
	a.staleWarned, a.keyWarned = false, false
	pinned := key != nil && !key.Equal(a.signingKey)
	warnUnsigned := key == nil && !a.unsignedWarned
	if key == nil {
		a.unsignedWarned = true
	}
	oldCluster, oldKey := a.clusterID, a.signingKey
	a.signingKey, a.stateKey = key, st.SigningKey
	a.previousKeys = nil
	if key != nil {
		a.previousKeys = st.SigningChain.Previous(key)
	}
	if verdict == stateRebuilt || verdict == stateRestored {
		// Records, tombstones and versions of the old cluster (or of the
		// table before the restore) mean nothing now; its state is the
		// truth.
		if verdict == stateRestored {
			a.restoreFloor = max(a.restoreFloor, a.masterIndex, highestVersion(a.members.State()))
		}
		a.members.Reset()
		a.self, a.network = nil, nil
		a.trigger(a.reregisterCh)
	}
	if st.ClusterID != "" {
		a.clusterID = st.ClusterID
	}
	oldEpoch := a.restoreEpoch
	a.restoreEpoch = st.Restore.RestoreEpoch()
	indexChanged := a.masterIndex != st.Index || oldCluster != a.clusterID || oldEpoch != a.restoreEpoch
	a.masterIndex = st.Index
	var netChanged bool
	a.network, netChanged = networkFrom(a.network, st.Network)
	a.revoked = membership.RevokedAgents(st.Revoked) // every state and changes answer carries the whole list
	registered := a.registered
	tr := a.trustLocked()
	a.mu.Unlock()

	if verdict == stateRebuilt {
		a.metrics.rebuilds.Inc()
		a.log.Warn("the masters' cluster was rebuilt: dropped the old cluster's membership; registering again",
			"old_cluster_id", oldCluster, "cluster_id", st.ClusterID, "index", st.Index)
		if a.onRebuild != nil {
			a.onRebuild(st.ClusterID)
		}
	}
	if verdict == stateRestored {
		a.metrics.restores.Inc()
		a.log.Warn("the masters' table was restored from a snapshot: dropped the membership of before; registering again",
			"epoch", st.Restore.Epoch, "was", oldEpoch, "snapshot_index", st.Restore.From, "index", st.Index)
	}
	switch {
	case pinned && oldKey != nil:
		a.metrics.signingKeyFollowed.Inc()
		a.log.Warn("the masters' signing key chain leads from the trusted key to a new one: verifying with it", "key", api.SigningKeyFingerprint(key), "old_key", api.SigningKeyFingerprint(oldKey), "cluster_id", st.ClusterID)
	case pinned:
		a.log.Info("verifying records with the masters' signing key, pinned from their state", "key", api.SigningKeyFingerprint(key), "cluster_id", st.ClusterID)
	case warnUnsigned:
		a.log.Warn("--insecure: the masters sign nothing; gossip is accepted without signature verification (range checks only)", "cluster_id", st.ClusterID)
	}
	in := membership.State{Tombstones: st.Tombstones}
	var mine *api.AgentInfo
	for i := range st.Agents {
		in.Records = append(in.Records, membership.NewPeerRecord(&st.Agents[i]))
		if st.Agents[i].AgentID == a.id {
			mine = &st.Agents[i]
		}
	}
	in, refused := tr.Admit(st.ClusterID, in, a.members)
	a.countRefused(a.metrics.masterRefused, "the masters' state", refused)
	refusing := signatureRefusals("the masters' state", refused)
	news := a.members.MergeFromMasters(in)
	var dropped []string
	if full {
		held := make(map[string]bool, len(st.Agents))
		for i := range st.Agents {
			held[st.Agents[i].AgentID] = true
		}
		if dropped = a.members.SyncWithMasters(held, st.Horizon); len(dropped) > 0 {
			a.log.Info("dropped peers the masters deleted before their compaction horizon", "peers", len(dropped), "horizon", st.Horizon)
		}
	} else {
		a.members.Compact(st.Horizon)
	}
	if mine != nil {
		a.updateSelf(mine)
		a.reclaimIP(mine)
	} else if tv, gone := a.members.Tombstone(a.id); gone && registered {
		a.mu.RLock()
		stale := a.self != nil && a.self.Version <= tv
		a.mu.RUnlock()
		if stale {
			a.trigger(a.reregisterCh)
		}
	}
	a.mu.Lock()
	if verdict == stateRebuilt || verdict == stateRestored || st.Index > a.mergedIndex {
		a.mergedIndex = st.Index
	}
	a.mu.Unlock()
	// Only a whole state whose records all verify ends a refusal, once
	// merged: changes hold only what changed, and what the agent refused
	// before is still missing from its membership.
	if refusing != "" || full {
		a.setRefusing(refusing)
	}
	changed := len(news.Records)+len(news.Tombstones)+len(dropped) > 0 || netChanged
	if changed || indexChanged || pinned || verdict == stateRebuilt || verdict == stateRestored {
		a.trigger(a.persistCh)
	}
	if changed || pinned {
		a.trigger(a.reconcileCh) // a new key is reported (report.go)
	}
	if changed {
		a.trigger(a.connectCh)
		a.channel.Broadcast(a.gossipData(news))
	}
	return true
}
