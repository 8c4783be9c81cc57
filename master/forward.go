package master

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// indexHeader carries the Raft index a write's answer reflects: a client (or
// the follower that proxied the write) that waits for it reads its own write.
const indexHeader = "X-Carve-Index"

// stateIndexHeader carries the index of the state in the answer's body.
const stateIndexHeader = "X-Carve-State-Index"

// forwardedHeader marks a request proxied by a follower, so that a leader
// change in between cannot make two followers bounce it between them.
const forwardedHeader = "X-Carve-Forwarded-By"

// setIndex sets the index header of a write's answer.
func setIndex(w http.ResponseWriter, index uint64) {
	w.Header().Set(indexHeader, strconv.FormatUint(index, 10))
}

// forward proxies a request to the leader and copies its answer back. A
// successful write's answer carries the index it reflects; the answer waits
// until this master has applied it, so that the client reads its own write
// here.
func (s *server) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	if r.Header.Get(forwardedHeader) != "" {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "this master is not the leader any more; retry")
		return
	}
	leaderID, _ := s.m.node.Leader()
	if leaderID == "" {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "no leader elected yet; retry")
		return
	}
	meta, ok := s.m.table.Server(leaderID)
	if !ok || meta.HTTPAddr == "" || leaderID == s.m.opts.ID {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("leader %s has not published its HTTP address yet; retry", leaderID))
		return
	}
	target := s.m.scheme() + meta.HTTPAddr + r.URL.RequestURI()
	req, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
	if err != nil {
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	req.Header = forwardHeaders(r, s.m.opts.ID)
	resp, err := s.client.Do(req)
	if err != nil {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, fmt.Sprintf("forward to leader %s at %s: %v; retry", leaderID, meta.HTTPAddr, err))
		return
	}
	defer resp.Body.Close()
	s.m.metrics.forwarded.Inc()
	if idx, err := strconv.ParseUint(resp.Header.Get(indexHeader), 10, 64); err == nil && resp.StatusCode < 300 {
		ctx, cancel := context.WithTimeout(r.Context(), applyTimeout)
		if err := s.m.node.WaitApplied(ctx, idx); err != nil {
			s.log.Warn("proxied write committed but not yet applied here", "index", idx, "err", err)
		}
		cancel()
	}
	for _, h := range []string{"Content-Type", "Retry-After", indexHeader, stateIndexHeader} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// forwardHeaders are the headers of r forwarded to the leader by the
// master of id: who the client is, for the leader to authorize and check
// against its own deny list.
func forwardHeaders(r *http.Request, id string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", r.Header.Get("Content-Type"))
	h.Set(forwardedHeader, id)
	if id, ok := requestIdentity(r); ok {
		// The leader authorizes the client, not this master.
		h.Set(identityHeader, id.String())
		if leaf := clientLeaf(r); leaf != nil {
			// The leader checks it against its deny list, which may hold a
			// revocation this master has not applied yet.
			h.Set(serialHeader, pki.Serial(leaf))
		}
	}
	if v := presentedCAValue(r); v != "" {
		// The leader learns which CA the agent's certificate comes from.
		h.Set(presentedCAHeader, v)
	}
	return h
}
