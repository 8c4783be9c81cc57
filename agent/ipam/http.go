package ipam

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/goroutines"
	"github.com/carve-net/carve/internal/httpapi"
)

// shutdownTimeout bounds how long Serve waits for requests in flight.
const shutdownTimeout = 5 * time.Second

// handler is the unix-socket API (/ipam/...) that carve-ipam and the
// operator's tools call (api.IPAMClient).
func (s *Service) handler() http.Handler {
	r := httpapi.NewRouter()
	r.HandleFunc("/ipam/allocate", post(s.Allocate)).Methods(http.MethodPost)
	r.HandleFunc("/ipam/release", post(s.Release)).Methods(http.MethodPost)
	r.HandleFunc("/ipam/gc", post(s.GC)).Methods(http.MethodPost)
	r.HandleFunc("/ipam/lookup", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		v, err := s.Lookup(api.IPAMRequest{Network: q.Get("network"), ContainerID: q.Get("container_id"), IfName: q.Get("ifname")})
		reply(w, v, err)
	}).Methods(http.MethodGet)
	r.HandleFunc("/ipam/allocations", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, s.List(r.URL.Query().Get("network")))
	}).Methods(http.MethodGet)
	r.HandleFunc("/ipam/status", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, s.Status(r.URL.Query().Get("network")))
	}).Methods(http.MethodGet)
	return r
}

// post serves a call whose request is the JSON body.
func post[Req, Resp any](call func(Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if httpapi.Decode(w, r, &req) {
			v, err := call(req)
			reply(w, v, err)
		}
	}
}

// reply writes an answer, or the error with its status and code.
func reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Status != 0 {
			httpapi.WriteError(w, ae.Status, ae.Code, ae.Message)
			return
		}
		httpapi.WriteError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, v)
}

// Serve serves the unix-socket API (handler) on ln until ctx ends.
func (s *Service) Serve(ctx context.Context, ln net.Listener) {
	srv := httpapi.NewServer(s.handler(), httpapi.ServerOptions{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)})
	// The shutdown is a goroutine Serve owns: it ends (requests in flight
	// answered) before Serve returns, also when serving failed.
	bg := goroutines.New(ctx)
	defer bg.Stop()
	bg.Go(func(ctx context.Context) {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(shut)
	})
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		s.log.Error("ipam socket stopped", "err", err)
	}
}
