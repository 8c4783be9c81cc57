package agent

import (
	"net/http"
	"net/http/pprof"
	"time"
)

// debugWriteTimeout lets a CPU profile of up to a few minutes finish
// (GET /debug/pprof/profile?seconds=N answers after N seconds).
const debugWriteTimeout = 5 * time.Minute

// debugRoutes serves Go's runtime profiles (net/http/pprof) for
// --debug-addr. They are on a listener of their own, off by default,
// without TLS or client certificates: an operator turns it on for a
// while, on loopback, to find where the agent's CPU or memory goes. The
// handlers are registered on a mux of their own, never on
// http.DefaultServeMux.
func debugRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
