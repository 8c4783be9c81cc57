package agent

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master"
)

// masterProxy stands between one agent and a real master. It passes every
// request through and counts the state answers; pointing it at another
// master shows the agent a stale or a rebuilt cluster.
type masterProxy struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	backend *url.URL
	states  int // state and changes answers served since the last switch
	// register, when set, may answer a registration itself (true) instead
	// of passing it through.
	register func(w http.ResponseWriter, body []byte) bool
	// down answers every request 503 no_leader, as a master without a
	// quorum does.
	down bool
	// unavailable, when set, answers the requests it matches 503
	// no_leader (a master that cannot commit them now), the others pass.
	unavailable func(r *http.Request) bool
	// readsRefused, when set, answers the state and changes reads with
	// it (a master that refuses the agent's certificate from now on);
	// registrations still pass.
	readsRefused *api.Error
	// inflight cancels the requests being passed on (setDown(true) ends
	// them, as a master going away ends its long polls).
	inflight map[*http.Request]context.CancelFunc
	// streams passes the changes streams on (setStreams); without it the
	// proxy answers them 404, as a master of a release before them does,
	// and the agent long-polls (the states counted here).
	streams bool
	// stallStreams answers the changes streams 200 and then nothing, as
	// a proxy that buffers answers does.
	stallStreams bool
	// streamsOpened counts the changes streams passed on, streamsRefused
	// those answered 404, longPolls the changes long polls passed on.
	streamsOpened, streamsRefused, longPolls int
}

func newMasterProxy(t *testing.T, m *master.Master) *masterProxy {
	t.Helper()
	p := &masterProxy{t: t}
	p.switchTo(m)
	rp := &httputil.ReverseProxy{ErrorLog: log.New(io.Discard, "", 0), Rewrite: func(r *httputil.ProxyRequest) {
		p.mu.Lock()
		r.SetURL(p.backend)
		p.mu.Unlock()
	}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		down := p.down || (p.unavailable != nil && p.unavailable(r))
		p.mu.Unlock()
		if down {
			httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeNoLeader, "masterProxy: down")
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		orig := r
		r = r.WithContext(ctx)
		p.mu.Lock()
		if p.inflight == nil {
			p.inflight = map[*http.Request]context.CancelFunc{}
		}
		p.inflight[orig] = cancel
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.inflight, orig)
			p.mu.Unlock()
		}()
		p.mu.Lock()
		refused := p.readsRefused
		p.mu.Unlock()
		isRead := r.Method == http.MethodGet && (r.URL.Path == "/overlay-master/state" || r.URL.Path == "/overlay-master/changes" || r.URL.Path == api.StreamPath)
		switch {
		case refused != nil && isRead:
			httpapi.WriteError(w, refused.Status, refused.Code, refused.Message)
			return
		case r.URL.Path == api.StreamPath:
			p.mu.Lock()
			streams := p.streams
			if streams {
				p.streamsOpened++
			} else {
				p.streamsRefused++
			}
			p.mu.Unlock()
			p.mu.Lock()
			stall := p.stallStreams
			p.mu.Unlock()
			if stall {
				w.WriteHeader(http.StatusOK)
				http.NewResponseController(w).Flush()
				<-r.Context().Done()
				return
			}
			if !streams {
				httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, "masterProxy: no such endpoint (a master of a release before the stream)")
				return
			}
		case r.Method == http.MethodGet && r.URL.Path == "/overlay-master/state":
			p.serveState(w, r)
			return
		case r.Method == http.MethodGet && r.URL.Path == "/overlay-master/changes":
			p.mu.Lock()
			p.longPolls++
			host := p.backend.Host
			p.mu.Unlock()
			rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
			rp.ServeHTTP(rec, r)
			p.mu.Lock()
			if rec.status == http.StatusOK && p.backend.Host == host {
				p.states++
			}
			p.mu.Unlock()
			return
		case r.Method == http.MethodPost && r.URL.Path == "/overlay-master/agents":
			body, err := io.ReadAll(r.Body)
			if err != nil {
				httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
				return
			}
			p.mu.Lock()
			hook := p.register
			p.mu.Unlock()
			if hook != nil && hook(w, body) {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *masterProxy) URL() string { return p.srv.URL }

// statusWriter remembers the status of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// switchTo sends every later request to m.
func (p *masterProxy) switchTo(m *master.Master) {
	u, err := url.Parse("http://" + m.HTTPAddr())
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backend, p.states = u, 0
}

// setStreams passes the changes streams on (true) or answers them 404;
// stall answers them 200 and then nothing.
func (p *masterProxy) setStreams(on, stall bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.streams, p.stallStreams = on, stall
}

// dropStreams ends the requests being passed on (the changes streams:
// the long polls are ended too), as a master that drops them does.
func (p *masterProxy) dropStreams() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cancel := range p.inflight {
		cancel()
	}
}

// watches counts the changes streams passed on and answered 404, and
// the changes long polls.
func (p *masterProxy) watches() (opened, refused, longPolls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streamsOpened, p.streamsRefused, p.longPolls
}

// setDown has the proxy answer every request 503 no_leader (true) or
// pass them on again (false).
func (p *masterProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, cancel := range p.inflight {
			cancel()
		}
	}
}

// statesServed counts the state and changes answers given since the last switch.
func (p *masterProxy) statesServed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.states
}

func (p *masterProxy) serveState(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	u := *p.backend
	p.mu.Unlock()
	u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
	var st api.State
	if err := api.Call(r.Context(), http.DefaultClient, http.MethodGet, u.String(), nil, &st, nil); err != nil {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
		return
	}
	p.mu.Lock()
	if p.backend.Host == u.Host {
		p.states++
	}
	p.mu.Unlock()
	httpapi.WriteJSON(w, http.StatusOK, &st)
}

// masterState reads a master's own state.
func masterState(t *testing.T, m *master.Master) *api.State {
	t.Helper()
	cl, err := apiclient.NewClient([]string{"http://" + m.HTTPAddr()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := cl.State(context.Background(), apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func masterClient(t *testing.T, m *master.Master) *apiclient.Client {
	t.Helper()
	cl, err := apiclient.NewClient([]string{"http://" + m.HTTPAddr()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// setUnavailable answers the requests f matches 503 no_leader from now on
// (nil: none).
func (p *masterProxy) setUnavailable(f func(r *http.Request) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unavailable = f
}
