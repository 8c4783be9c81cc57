package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/carve-net/carve/api"
)

// fakeAgent implements the agent's IPAM contract (api/ipam.go) on a unix
// socket, faithfully enough for the plugin: idempotent by (network, container
// id, interface), the lowest free address of the bridge's sub-subnet with the
// gateway (its first host) excluded, release of unknown attachments
// succeeding with an empty list, GC keeping exactly the listed attachments,
// and the contract's error codes. One mutex serialises every call, as the
// agent's store does.
//
// The plugin's own tests use it to put the agent in the states they map to
// CNI errors (not ready, exhausted, unknown network, down) on demand and in
// milliseconds; carve-ipam against the real agent is tested by
// labcluster.TestCluster and e2e.TestCNI.
type fakeAgent struct {
	Sock string

	mu   sync.Mutex
	nets map[string]*fakeNet
	srv  *http.Server  // nil while stopped
	done chan struct{} // closed when srv has stopped serving
}

type fakeNet struct {
	ready  bool
	err    string
	mtu    int
	pools  map[string]*fakePool // by bridge kind
	allocs map[fakeKey]*api.Allocation
}

type fakeKey struct{ cid, ifname string }

type fakePool struct {
	prefix  netip.Prefix
	gateway netip.Addr
	used    map[netip.Addr]fakeKey
}

// fakeNetConfig configures one overlay of the fake agent.
type fakeNetConfig struct {
	Name string
	// Mesos and Docker are the bridge sub-subnets; Docker may be invalid.
	Mesos, Docker netip.Prefix
	MTU           int
	NotReady      bool
}

// shortTempDir returns a fresh directory with a short path (a unix socket
// path must fit in 108 bytes), removed at the end of the test.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "carvecni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startFakeAgent serves the given overlays on a socket in a fresh directory
// until the test ends.
func startFakeAgent(t testing.TB, nets ...fakeNetConfig) *fakeAgent {
	t.Helper()
	f := &fakeAgent{Sock: filepath.Join(shortTempDir(t), "agent.sock"), nets: map[string]*fakeNet{}}
	for _, n := range nets {
		f.AddNetwork(n)
	}
	f.Start(t)
	t.Cleanup(f.Stop)
	return f
}

// Start listens on the socket again after Stop, with the allocations kept,
// as an agent restarted from its local state does.
func (f *fakeAgent) Start(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("unix", f.Sock)
	if err != nil {
		t.Fatalf("fake agent: listen: %v", err)
	}
	f.srv = &http.Server{Handler: f}
	f.done = make(chan struct{})
	go func(srv *http.Server, done chan struct{}) {
		defer close(done)
		_ = srv.Serve(ln)
	}(f.srv, f.done)
}

// Stop closes the listener and removes the socket, as a stopped agent does.
func (f *fakeAgent) Stop() {
	if f.srv == nil {
		return
	}
	_ = f.srv.Close()
	<-f.done
	f.srv = nil
	_ = os.Remove(f.Sock)
}

// AddNetwork adds (or replaces) an overlay.
func (f *fakeAgent) AddNetwork(c fakeNetConfig) {
	n := &fakeNet{ready: !c.NotReady, mtu: c.MTU, pools: map[string]*fakePool{}, allocs: map[fakeKey]*api.Allocation{}}
	if !n.ready {
		n.err = "no lease for overlay " + c.Name + " yet"
	}
	for kind, p := range map[string]netip.Prefix{api.BridgeMesos: c.Mesos, api.BridgeDocker: c.Docker} {
		if p.IsValid() {
			n.pools[kind] = &fakePool{prefix: p.Masked(), gateway: p.Masked().Addr().Next(), used: map[netip.Addr]fakeKey{}}
		}
	}
	f.mu.Lock()
	f.nets[c.Name] = n
	f.mu.Unlock()
}

// SetReady flips an overlay's readiness.
func (f *fakeAgent) SetReady(network string, ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nets[network]
	n.ready = ready
	n.err = ""
	if !ready {
		n.err = "no lease for overlay " + network + " yet"
	}
}

// Keys returns "cid/ifname" of every allocation of the network, sorted.
func (f *fakeAgent) Keys(network string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k := range f.nets[network].allocs {
		out = append(out, k.cid+"/"+k.ifname)
	}
	sort.Strings(out)
	return out
}

type fakeErr struct {
	status int
	code   string
	msg    string
}

func (e *fakeErr) Error() string { return e.msg }

func badRequest(format string, a ...any) *fakeErr {
	return &fakeErr{http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf(format, a...)}
}

// ServeHTTP routes the contract's endpoints.
func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var out any
	var err error
	route := map[string]string{
		"/ipam/allocate": http.MethodPost, "/ipam/release": http.MethodPost, "/ipam/gc": http.MethodPost,
		"/ipam/lookup": http.MethodGet, "/ipam/allocations": http.MethodGet, "/ipam/status": http.MethodGet,
	}
	method, ok := route[r.URL.Path]
	switch {
	case !ok:
		err = &fakeErr{http.StatusNotFound, api.CodeNotFound, "no endpoint " + r.URL.Path}
	case r.Method != method:
		err = &fakeErr{http.StatusMethodNotAllowed, api.CodeBadRequest, "method " + r.Method + " not allowed"}
	default:
		q := r.URL.Query()
		f.mu.Lock()
		switch r.URL.Path {
		case "/ipam/allocate":
			var req api.IPAMRequest
			if err = decode(r, &req); err == nil {
				out, err = f.allocate(req)
			}
		case "/ipam/release":
			var req api.IPAMRequest
			if err = decode(r, &req); err == nil {
				out, err = f.release(req)
			}
		case "/ipam/gc":
			var req api.GCRequest
			if err = decode(r, &req); err == nil {
				out, err = f.gc(req)
			}
		case "/ipam/lookup":
			out, err = f.lookup(api.IPAMRequest{Network: q.Get("network"), ContainerID: q.Get("container_id"), IfName: q.Get("ifname")})
		case "/ipam/allocations":
			out, err = f.list(q.Get("network"))
		case "/ipam/status":
			out, err = f.status(q.Get("network"))
		}
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		var fe *fakeErr
		if !errors.As(err, &fe) {
			fe = &fakeErr{http.StatusInternalServerError, api.CodeInternal, err.Error()}
		}
		w.WriteHeader(fe.status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": fe.msg, "code": fe.code})
		return
	}
	_ = json.NewEncoder(w).Encode(out)
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("malformed request: %v", err)
	}
	return nil
}

// network finds the overlay the request names.
func (f *fakeAgent) network(name string) (*fakeNet, error) {
	if name == "" {
		return nil, badRequest("network is required")
	}
	n, ok := f.nets[name]
	if !ok {
		return nil, &fakeErr{http.StatusNotFound, api.CodeNotFound, "unknown network " + name}
	}
	return n, nil
}

func attachment(req api.IPAMRequest) (fakeKey, error) {
	if req.ContainerID == "" {
		return fakeKey{}, badRequest("container_id is required")
	}
	if req.IfName == "" {
		return fakeKey{}, badRequest("ifname is required")
	}
	return fakeKey{req.ContainerID, req.IfName}, nil
}

func (f *fakeAgent) allocate(req api.IPAMRequest) (*api.Allocation, error) {
	n, err := f.network(req.Network)
	if err != nil {
		return nil, err
	}
	k, err := attachment(req)
	if err != nil {
		return nil, err
	}
	if a, ok := n.allocs[k]; ok {
		return a, nil
	}
	if !n.ready {
		return nil, &fakeErr{http.StatusServiceUnavailable, api.CodeNotReady, n.err}
	}
	kind := req.Bridge
	if kind == "" {
		kind = api.BridgeMesos
	}
	pool, ok := n.pools[kind]
	if !ok {
		return nil, badRequest("bridge %q has no sub-subnet on %s", req.Bridge, req.Network)
	}
	var addr netip.Addr
	if req.Address != "" {
		if addr, err = netip.ParseAddr(req.Address); err != nil {
			return nil, badRequest("address: %v", err)
		}
		if !pool.usable(addr) {
			return nil, badRequest("address %s is not a host of %s", addr, pool.prefix)
		}
		if owner, taken := pool.used[addr]; taken {
			return nil, &fakeErr{http.StatusConflict, api.CodeTaken, fmt.Sprintf("%s belongs to %s/%s", addr, owner.cid, owner.ifname)}
		}
	} else {
		for a := pool.gateway.Next(); pool.usable(a); a = a.Next() {
			if _, taken := pool.used[a]; !taken {
				addr = a
				break
			}
		}
		if !addr.IsValid() {
			return nil, &fakeErr{http.StatusConflict, api.CodeExhausted, fmt.Sprintf("no free address in %s", pool.prefix)}
		}
	}
	pool.used[addr] = k
	a := &api.Allocation{
		Network: req.Network, ContainerID: k.cid, IfName: k.ifname, Bridge: kind,
		IPs:    []api.IPConfig{{Address: netip.PrefixFrom(addr, pool.prefix.Bits()).String(), Gateway: pool.gateway.String()}},
		Routes: []api.Route{{Dst: "0.0.0.0/0", GW: pool.gateway.String()}},
		MTU:    n.mtu,
	}
	n.allocs[k] = a
	return a, nil
}

// usable reports whether a is a host address of the pool other than the
// gateway (IPv4: neither the network nor the broadcast address).
func (p *fakePool) usable(a netip.Addr) bool {
	if !p.prefix.Contains(a) || a == p.prefix.Addr() || a == p.gateway {
		return false
	}
	return a.Next().IsValid() && p.prefix.Contains(a.Next()) // not the broadcast address
}

func (n *fakeNet) free(k fakeKey) *api.Allocation {
	a, ok := n.allocs[k]
	if !ok {
		return nil
	}
	delete(n.allocs, k)
	for _, ipc := range a.IPs {
		p := netip.MustParsePrefix(ipc.Address)
		delete(n.pools[a.Bridge].used, p.Addr())
	}
	return a
}

func (f *fakeAgent) release(req api.IPAMRequest) (*api.Released, error) {
	n, err := f.network(req.Network)
	if err != nil {
		return nil, err
	}
	k, err := attachment(req)
	if err != nil {
		return nil, err
	}
	out := &api.Released{Released: []api.Allocation{}}
	if a := n.free(k); a != nil {
		out.Released = append(out.Released, *a)
	}
	return out, nil
}

func (f *fakeAgent) lookup(req api.IPAMRequest) (*api.Allocation, error) {
	n, err := f.network(req.Network)
	if err != nil {
		return nil, err
	}
	k, err := attachment(req)
	if err != nil {
		return nil, err
	}
	a, ok := n.allocs[k]
	if !ok {
		return nil, &fakeErr{http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no allocation for %s/%s on %s", k.cid, k.ifname, req.Network)}
	}
	return a, nil
}

func (f *fakeAgent) list(network string) (*api.Allocations, error) {
	out := &api.Allocations{Allocations: []api.Allocation{}}
	for name, n := range f.nets {
		if network != "" && name != network {
			continue
		}
		for _, a := range n.allocs {
			out.Allocations = append(out.Allocations, *a)
		}
	}
	return out, nil
}

func (f *fakeAgent) gc(req api.GCRequest) (*api.Released, error) {
	n, err := f.network(req.Network)
	if err != nil {
		return nil, err
	}
	keep := map[fakeKey]bool{}
	keepAll := map[string]bool{}
	for i, k := range req.Keep {
		if k.ContainerID == "" {
			return nil, badRequest("keep[%d].container_id is required", i)
		}
		if k.IfName == "" {
			keepAll[k.ContainerID] = true
		}
		keep[fakeKey{k.ContainerID, k.IfName}] = true
	}
	out := &api.Released{Released: []api.Allocation{}}
	for k, a := range n.allocs {
		if keep[k] || keepAll[k.cid] || (req.Bridge != "" && a.Bridge != req.Bridge) {
			continue
		}
		out.Released = append(out.Released, *n.free(k))
	}
	return out, nil
}

func (f *fakeAgent) status(network string) (*api.IPAMStatus, error) {
	n, err := f.network(network)
	if err != nil {
		return nil, err
	}
	st := &api.IPAMStatus{Network: network, Ready: n.ready, Error: n.err, Free: map[string]uint64{}}
	for kind, p := range n.pools {
		var free uint64
		for a := p.gateway.Next(); p.usable(a); a = a.Next() {
			if _, taken := p.used[a]; !taken {
				free++
			}
		}
		st.Free[kind] = free
	}
	return st, nil
}
