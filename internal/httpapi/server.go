package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// Defaults of ServerOptions.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	// DefaultMaxConns leaves room for 50,000 agents' watches on three
	// masters with one of them down (25,000 each) plus operators and the
	// other masters; the descriptor limit lowers it (the systemd unit's
	// LimitNOFILE=65536 does not).
	DefaultMaxConns = 32768
	// DefaultUnauthenticatedTimeout bounds the handshake, requests and idle
	// time of a connection without a client certificate (a load
	// balancer's /healthz, a scraper's /metrics).
	DefaultUnauthenticatedTimeout = 5 * time.Second
)

// ServerOptions bound what a client can hold of a carve HTTP server. Zero
// fields take the Default* values.
type ServerOptions struct {
	// ReadHeaderTimeout bounds the TLS handshake and the request headers: a
	// client that sends them slowly (slowloris) is dropped when it expires.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds a request's handling and answer, counted from the
	// end of its headers. A handler that waits on purpose (the blocking
	// watch) extends its own deadlines with ExtendDeadlines.
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that sends no next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes int
	// MaxConns caps the connections held at once; beyond it the oldest
	// connection without a certificate is closed, or, when authenticated
	// connections hold every slot, the next one is reset (its client
	// tries another master). Serve lowers it to what the process's
	// descriptor limit holds, less 1,024 for the rest of the process
	// (MaxConns tells the cap in force).
	MaxConns int
	// TLS, when set, serves HTTPS (HTTP/1.1) with this configuration.
	TLS *tls.Config
	// UnauthenticatedConns caps, under TLS with client certificates (a
	// ClientAuth that asks for them, or a GetConfigForClient, as
	// pki.Reloader's configuration has), the connections held by clients
	// that have not (yet) presented a certificate of the CA, whatever they
	// do (stall in the handshake, idle after a request, keep alive):
	// beyond it the oldest of them is closed. They are also the first
	// closed when MaxConns is reached, so that authenticated clients are
	// always served. Default MaxConns/8.
	UnauthenticatedConns int
	// UnauthenticatedTimeout bounds, on such a connection, the TLS
	// handshake, each request's reading and the idle time between
	// requests. Default DefaultUnauthenticatedTimeout.
	UnauthenticatedTimeout time.Duration
	// ErrorLog receives the server's own errors (TLS handshakes that fail,
	// say); nil means the log package's standard logger.
	ErrorLog *log.Logger
}

func (o ServerOptions) withDefaults() ServerOptions {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.UnauthenticatedConns <= 0 {
		o.UnauthenticatedConns = max(o.MaxConns/8, 1)
	}
	if o.UnauthenticatedTimeout <= 0 {
		o.UnauthenticatedTimeout = DefaultUnauthenticatedTimeout
	}
	return o
}

// Server is the one HTTP server constructor of carve: every timeout set, the
// header size bounded, the connections capped, TLS when configured.
type Server struct {
	http  *http.Server
	opts  ServerOptions
	limit *limitListener // set by Serve
	mu    sync.Mutex
}

// NewServer returns a server of handler bounded by opts.
func NewServer(handler http.Handler, opts ServerOptions) *Server {
	opts = opts.withDefaults()
	return &Server{opts: opts, http: &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: opts.ReadHeaderTimeout,
		ReadTimeout:       opts.ReadTimeout,
		WriteTimeout:      opts.WriteTimeout,
		IdleTimeout:       opts.IdleTimeout,
		MaxHeaderBytes:    opts.MaxHeaderBytes,
		ErrorLog:          opts.ErrorLog,
		ConnContext:       withBatchConn,
		ConnState:         markAuthenticated,
	}}
}

// Serve accepts connections on ln until Shutdown or Close; it returns
// http.ErrServerClosed then. Call it once.
func (s *Server) Serve(ln net.Listener) error {
	if n, lowered := capToFDs(s.opts.MaxConns, fdLimit()); lowered {
		s.mu.Lock()
		s.opts.MaxConns = n
		s.opts.UnauthenticatedConns = min(s.opts.UnauthenticatedConns, max(n/8, 1))
		s.mu.Unlock()
	}
	limited := newLimitListener(ln, s.opts.MaxConns, s.unauthLimits())
	s.mu.Lock()
	s.limit = limited
	s.mu.Unlock()
	var serveLn net.Listener = limited
	if s.opts.TLS != nil {
		cfg := s.opts.TLS.Clone()
		// HTTP/1.1 only: the timeouts above and ExtendDeadlines act on
		// the connection, which HTTP/2 would share between requests.
		cfg.NextProtos = []string{"http/1.1"}
		serveLn = tls.NewListener(newBatchListener(limited), cfg)
	}
	return s.http.Serve(serveLn)
}

// unauthLimits is what Serve bounds unauthenticated connections with:
// only under TLS that asks for client certificates can a connection prove
// who it is; otherwise every connection counts as authenticated.
func (s *Server) unauthLimits() unauthLimits {
	if s.opts.TLS == nil || !asksForClientCerts(s.opts.TLS) {
		return unauthLimits{}
	}
	return unauthLimits{conns: s.opts.UnauthenticatedConns, timeout: s.opts.UnauthenticatedTimeout}
}

// asksForClientCerts tells whether handshakes under cfg may verify a
// client certificate: its ClientAuth asks for one, or GetConfigForClient
// chooses the configuration at each handshake. The latter is how
// pki.Reloader serves the files as last loaded, and its outer ClientAuth
// is the zero NoClientCert: taking that for "no client certificates"
// counted every connection of the masters and agents as authenticated,
// and clients without a certificate that sent one request and idled held
// every slot (issue 26). A configuration chosen per handshake that never
// asks gets every connection counted as unauthenticated: its share and
// timeout, never more than MaxConns.
func asksForClientCerts(cfg *tls.Config) bool {
	return cfg.ClientAuth != tls.NoClientCert || cfg.GetConfigForClient != nil
}

// Evicted is the number of unauthenticated connections closed to make room
// (see ServerOptions.UnauthenticatedConns).
func (s *Server) Evicted() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit == nil {
		return 0
	}
	return s.limit.evicted.Load()
}

// Shed is the number of connections turned away (reset) because
// authenticated connections held every slot of the cap.
func (s *Server) Shed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit == nil {
		return 0
	}
	return s.limit.shed.Load()
}

// MaxConns is the connection cap in force: ServerOptions.MaxConns, lowered
// by Serve to what the descriptor limit holds.
func (s *Server) MaxConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.MaxConns
}

// Conns is the number of connections the server holds now.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit == nil {
		return 0
	}
	return s.limit.open()
}

// Shutdown stops accepting and waits for the requests in flight (see
// http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

// Close closes the listener and every connection at once.
func (s *Server) Close() error { return s.http.Close() }

// ExtendDeadlines gives a handler that waits on purpose (a blocking query)
// d more to finish: the connection's write deadline, and its read deadline,
// whose expiry would otherwise cancel the request's context while the
// handler waits.
func ExtendDeadlines(w http.ResponseWriter, d time.Duration) error {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(d)
	if err := rc.SetWriteDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if err := rc.SetReadDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}
