package master

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/state"
)

// The operator's snapshots of the lease table: GET /cluster/snapshot (carve
// snapshot save) and POST /cluster/restore (carve snapshot restore), and
// the restore a new cluster's first leader commits (Options.RestoreFrom).

// snapshot answers the lease table as the leader holds it after a read
// barrier: everything committed before the request is in it.
func (s *server) snapshot(w http.ResponseWriter, r *http.Request) {
	if !s.readOnLeader(w, r, "read barrier before the snapshot (retry)") || !s.servable(w, true) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := s.m.table.WriteSnapshot(w); err != nil {
		s.log.Warn("write snapshot", "err", err)
	}
}

// restore replaces the lease table with a snapshot, as a command of the
// log (logcmd.RestoreCommand), and answers the restore.
func (s *server) restore() http.HandlerFunc {
	return handleWrite(s, write[api.RestoreRequest, state.Result]{
		body: true,
		prepare: func(_ *http.Request, req *api.RestoreRequest) (action[state.Result], error) {
			if len(req.Snapshot) == 0 {
				return nil, errors.New("snapshot is required: the file carve snapshot save wrote")
			}
			info, err := state.CheckSnapshot(req.Snapshot)
			if err != nil {
				return nil, err
			}
			act := s.proposal(logcmd.RestoreCommand(req.Snapshot, time.Now()))
			return func(ctx context.Context) (state.Result, uint64, error) {
				res, index, err := act(ctx)
				if err == nil {
					s.log.Warn("lease table restored from a snapshot", "snapshot_index", info.StateIndex, "agents", info.Agents, "index", index)
				}
				return res, index, err
			}, nil
		},
		answer: func(w http.ResponseWriter, _ state.Result) {
			httpapi.WriteJSON(w, http.StatusOK, s.m.table.LastRestore())
		},
	})
}

// restoreFrom commits Options.RestoreFrom when this cluster's log is new
// (no cluster id yet): the first step of a whole-cluster restore, before
// the cluster id a new cluster would draw, so that agents never see a
// cluster without their leases. Ignored (with a warning) once the log has
// a cluster.
func (m *Master) restoreFrom(ctx context.Context) error {
	if len(m.opts.RestoreFrom) == 0 || m.table.ClusterID() != "" {
		return nil
	}
	if _, _, err := m.apply(ctx, logcmd.RestoreCommand(m.opts.RestoreFrom, time.Now())); err != nil {
		return fmt.Errorf("restore from the snapshot of --restore-from: %w", err)
	}
	r := m.table.LastRestore()
	m.log.Warn("new cluster restored from the snapshot of --restore-from: remove the flag", "cluster_id", m.table.ClusterID(),
		"snapshot_index", r.From, "epoch", r.Epoch, "history", m.table.History())
	return nil
}
