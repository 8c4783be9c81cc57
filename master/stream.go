package master

import (
	"net/http"

	"github.com/carve-net/carve/master/changestream"
)

// changesStream serves GET /overlay-master/changes/stream?since=N[&heartbeat=D]
// (the stream itself: master/changestream) once this master may serve
// the state and still keeps the changes since N.
func (s *server) changesStream(w http.ResponseWriter, r *http.Request) {
	q, ok := changestream.ParseQuery(w, r)
	if !ok || !s.servable(w, false) {
		return
	}
	// A watcher already behind what is kept learns it before the stream
	// begins, as the long poll's does.
	if oldest := s.m.table.OldestChanges(); q.Since < oldest {
		s.writeGone(w, q.Since, oldest)
		return
	}
	q.Gzip = acceptsGzip(r)
	streams := &changestream.Server{
		Table: s.m.table, Identity: requestIdentity, Revoked: s.revokedClient, Stop: s.m.runCtx.Done(),
		WriteTimeout: s.m.opts.StreamWriteTimeout, GzipMinBytes: gzipMinBytes, Log: s.log,
		Open: s.m.metrics.streams, Ends: s.m.metrics.streamEnds,
	}
	streams.Serve(w, r, q)
}
