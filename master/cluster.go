package master

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/raftlog"
)

// The API of the masters' own cluster: its status, joining and removing a
// master (writes, write.go), and the health check.

func (s *server) clusterStatus(w http.ResponseWriter, r *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, s.m.ClusterStatus())
}

// join adds a master as a voter, after publishing its HTTP address in the
// log (followers forward writes to the leader's).
func (s *server) join() http.HandlerFunc {
	return handleWrite(s, write[api.JoinRequest, struct{}]{
		body: true,
		prepare: func(_ *http.Request, req *api.JoinRequest) (action[struct{}], error) {
			if req.ID == "" {
				return nil, errors.New("id is required")
			}
			if err := checkAdvertisedAddr(req.RaftAddr); err != nil {
				return nil, fmt.Errorf("raft_addr %q: %v", req.RaftAddr, err)
			}
			if req.HTTPAddr != "" {
				if err := checkAdvertisedAddr(req.HTTPAddr); err != nil {
					return nil, fmt.Errorf("http_addr %q: %v", req.HTTPAddr, err)
				}
			}
			return func(ctx context.Context) (struct{}, uint64, error) {
				var index uint64
				if req.HTTPAddr != "" {
					meta := state.ServerMeta{ID: req.ID, RaftAddr: req.RaftAddr, HTTPAddr: req.HTTPAddr}
					var err error
					if _, index, err = s.proposal(logcmd.ServerMetaCommand(meta))(ctx); err != nil {
						return struct{}{}, 0, err
					}
				}
				if err := s.m.node.AddVoter(ctx, req.ID, req.RaftAddr); err != nil {
					return struct{}{}, 0, membershipErr(err, fmt.Sprintf("add voter %s at %s", req.ID, req.RaftAddr))
				}
				s.log.Info("master joined", "id", req.ID, "raft_addr", req.RaftAddr, "http_addr", req.HTTPAddr)
				return struct{}{}, index, nil
			}, nil
		},
		answer: s.answerClusterStatus,
	})
}

// removeServer removes a master from the Raft configuration.
func (s *server) removeServer() http.HandlerFunc {
	return handleWrite(s, write[struct{}, struct{}]{
		prepare: func(r *http.Request, _ *struct{}) (action[struct{}], error) {
			id := mux.Vars(r)["id"]
			return func(ctx context.Context) (struct{}, uint64, error) {
				if !s.m.knowsServer(id) {
					return struct{}{}, 0, fmt.Errorf("%w %q: the cluster's servers are %s (carve cluster status lists them)", errUnknownServer, id, s.m.serverIDs())
				}
				if err := s.m.node.RemoveServer(ctx, id); err != nil {
					return struct{}{}, 0, membershipErr(err, "remove server "+id)
				}
				s.log.Info("master removed", "id", id)
				return struct{}{}, 0, nil
			}, nil
		},
		answer: s.answerClusterStatus,
	})
}

// errUnknownServer is a removal of a master the cluster never knew: a
// typo, answered 404 rather than a removal of nothing.
var errUnknownServer = errors.New("no such master")

// knowsServer tells whether id is a server of the Raft configuration, or
// one the log knows (it led or joined with an HTTP address, and may have
// been removed since: removing it again changes nothing and succeeds).
func (m *Master) knowsServer(id string) bool {
	if _, ok := m.table.Server(id); ok {
		return true
	}
	return slices.ContainsFunc(m.node.Status().Servers, func(s raftlog.Server) bool { return s.ID == id })
}

// serverIDs names the servers of the Raft configuration: "m1, m2, m3".
func (m *Master) serverIDs() string {
	var ids []string
	for _, s := range m.node.Status().Servers {
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ", ")
}

// membershipErr is what a refused change of the Raft configuration
// answers: a 409 naming what, unless this master no longer leads (then
// the leader takes the request).
func membershipErr(err error, what string) error {
	if errors.Is(err, raftlog.ErrNotLeader) {
		return err
	}
	return &membershipError{msg: fmt.Sprintf("%s: %v", what, err)}
}

// answerClusterStatus answers a change of the cluster with its status.
func (s *server) answerClusterStatus(w http.ResponseWriter, _ struct{}) {
	httpapi.WriteJSON(w, http.StatusOK, s.m.ClusterStatus())
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	st := s.m.node.Status()
	if st.Role == "shutdown" {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "raft is shut down")
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "id": s.m.opts.ID, "role": st.Role, "caught_up": st.CaughtUp})
}
