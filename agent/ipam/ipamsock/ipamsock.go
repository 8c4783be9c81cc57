// Package ipamsock is the IPAM's unix-socket API (/ipam/...), the one
// carve-ipam and the operator's tools call (api.IPAMClient): the routes,
// their JSON requests and answers, errors with their status and code, and
// serving until the context ends. What each call does is its Service's.
//
// Its exported surface is this file.
package ipamsock

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

// Service is what the socket serves: the IPAM's calls. An error that is
// an *api.Error with a status is answered with its status and code.
type Service interface {
	Allocate(api.IPAMRequest) (*api.Allocation, error)
	Release(api.IPAMRequest) (*api.Released, error)
	GC(api.GCRequest) (*api.Released, error)
	Lookup(api.IPAMRequest) (*api.Allocation, error)
	List(network string) *api.Allocations
	Status(network string) *api.IPAMStatus
}

// Handler is the unix-socket API of s.
func Handler(s Service) http.Handler {
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

// Serve serves s's unix-socket API (Handler) on ln until ctx ends, and
// returns once the requests in flight are answered.
func Serve(ctx context.Context, ln net.Listener, s Service, log *slog.Logger) {
	srv := httpapi.NewServer(Handler(s), httpapi.ServerOptions{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
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
		log.Error("ipam socket stopped", "err", err)
	}
}
