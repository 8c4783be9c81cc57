package master

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/state"
)

// What only the leader does, and the one way every command is proposed.

// leaderDuties runs, whenever this node leads and has caught up with the
// log, what only a leader does: commit a cluster id when the log has none,
// publish its HTTP address in the log (followers proxy to it) and commit its
// network configuration file into a cluster that has none (config.go).
func (m *Master) leaderDuties(ctx context.Context) {
	changes := m.node.LeaderChanges()
	caughtUp := m.node.CaughtUp()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	compact := time.NewTicker(m.opts.CompactEvery)
	defer compact.Stop()
	var leadingSince time.Time // judged at the ticks only: O(agents) each
	for {
		if m.node.IsLeader() && m.node.IsCaughtUp() {
			if err := m.leaderSetup(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("leader setup", "err", err)
			}
			if err := m.releaseQuarantine(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("quarantine release", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-m.releaseKick:
		case <-changes:
		case <-caughtUp:
			caughtUp = nil // closed for good: wait on it once
		case <-tick.C:
			m.judgeLiveness(&leadingSince)
		case <-compact.C:
			if m.node.IsLeader() && m.node.IsCaughtUp() {
				m.proposeCompaction(ctx)
			}
		}
	}
}

// proposeCompaction has the log compact the tombstones older than
// TombstoneMaxAge by this leader's clock (applyCompact decides which).
func (m *Master) proposeCompaction(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	before := m.table.Horizon()
	if _, _, err := m.apply(ctx, logcmd.CompactCommand(time.Now(), m.opts.TombstoneMaxAge)); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("propose tombstone compaction", "err", err)
		}
		return
	}
	if after := m.table.Horizon(); after != before {
		m.log.Info("tombstones compacted", "horizon", after)
	}
}

func (m *Master) leaderSetup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.restoreFrom(ctx); err != nil {
		return err
	}
	if m.table.ClusterID() == "" {
		id, err := newClusterID()
		if err != nil {
			return err
		}
		// Should another leader have committed one first, that one stays.
		if _, _, err := m.apply(ctx, logcmd.ClusterIDCommand(id)); err != nil {
			return fmt.Errorf("commit cluster id: %w", err)
		}
		m.log.Info("cluster id committed", "cluster_id", m.table.ClusterID())
	}
	self := state.ServerMeta{ID: m.opts.ID, RaftAddr: m.node.Addr(), HTTPAddr: m.HTTPAddr()}
	if cur, ok := m.table.Server(m.opts.ID); !ok || cur != self {
		if _, _, err := m.apply(ctx, logcmd.ServerMetaCommand(self)); err != nil {
			return fmt.Errorf("publish http address: %w", err)
		}
	}
	// The configuration's one authority is the committed one: an election
	// commits this master's file only into a cluster that has none.
	return m.commitBootstrapConfig(func(cmd logcmd.Command) (state.Result, error) {
		res, _, err := m.apply(ctx, cmd)
		return res, err
	})
}

// kickRelease asks the leader's duties to look for a quarantine release.
func (m *Master) kickRelease() {
	select {
	case m.releaseKick <- struct{}{}:
	default:
	}
}

// releaseQuarantine proposes a quarantine release when the holdings
// acknowledgements this leader received cover every live agent past the
// deletion of some quarantined space.
func (m *Master) releaseQuarantine(ctx context.Context) error {
	cmd, ok := m.table.ReleaseProposal()
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, _, err := m.apply(ctx, cmd)
	if err != nil {
		return fmt.Errorf("commit quarantine release: %w", err)
	}
	if res.Released > 0 {
		m.metrics.released.Add(float64(res.Released))
		m.log.Info("quarantine released", "blocks", res.Released)
	}
	return nil
}

// apply proposes a command and returns its result, with the log index
// that applied it; the error is the table's (Result.Err), or a
// *proposeError when Raft did not apply the command here.
func (m *Master) apply(ctx context.Context, cmd logcmd.Command) (state.Result, uint64, error) {
	data, err := cmd.Encode()
	if err != nil {
		return state.Result{}, 0, err
	}
	out, index, err := m.node.Apply(ctx, data)
	if err != nil {
		return state.Result{}, 0, &proposeError{err}
	}
	res, ok := out.(state.Result)
	if !ok {
		return state.Result{}, 0, fmt.Errorf("unexpected apply result %T", out)
	}
	return res, index, res.Err
}

// newClusterID draws the id that names a new cluster's log.
func newClusterID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw a cluster id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// joinCluster asks the masters at Options.Join to add this node, until one agrees.
func (m *Master) joinCluster(ctx context.Context) {
	client := m.joinClient
	req := api.JoinRequest{ID: m.opts.ID, RaftAddr: m.node.Addr(), HTTPAddr: m.HTTPAddr()}
	backoff := retry.Backoff{First: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := client.Join(cctx, req)
		cancel()
		if err == nil {
			m.log.Info("joined the cluster", "via", m.opts.Join)
			return
		}
		wait := backoff.Next()
		m.log.Warn("join failed, retrying", "via", m.opts.Join, "err", err, "in", wait)
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}
