// Package dockeripam serves carve's container addresses to Docker: a
// libnetwork remote IPAM driver on a unix socket, and an engine loop that
// creates a Docker network for every overlay of the agent (named after the
// overlay, as in DC/OS, on the agent's bridge d-<overlay>) and takes back the addresses of containers Docker forgot to release.
//
// The package does not import the agent: it works on an AddressService, which
// the agent's *ipam.Service satisfies.
package dockeripam

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
)

// AddressService is the part of the agent's IPAM that Docker needs.
// *ipam.Service implements it.
type AddressService interface {
	Allocate(api.IPAMRequest) (*api.Allocation, error)
	Release(api.IPAMRequest) (*api.Released, error)
	ReleaseAddress(network string, addr netip.Addr) (*api.Released, error)
	List(network string) *api.Allocations
	Networks() []string
	BridgeSubnets(network, bridge string) (v4, v6 netip.Prefix, ok bool)
}

// The libnetwork remote IPAM protocol (moby's pkg/plugins and
// libnetwork/ipams/remote/api). Docker POSTs JSON to /<Endpoint> and reads
// a non-200 answer as an error whose message is the body's "Err" field; a 200
// answer is decoded into the call's response, whose own "Error" field is
// an error too when set. Errors are therefore sent with status 500 and
// {"Err": "..."}, as Docker's go-plugins-helpers do.
const (
	// ContentType is the media type of the plugin protocol's bodies.
	ContentType = "application/vnd.docker.plugins.v1.2+json"

	// Option keys Docker uses.
	optRequestAddressType = "RequestAddressType"
	optGatewayType        = "com.docker.network.gateway"
	optMACAddress         = "com.docker.network.endpoint.macaddress"

	// OptionNetwork is the IPAM option (docker network create --ipam-opt
	// network=<overlay>) that names the carve overlay of a Docker network.
	OptionNetwork = "network"

	// LocalAddressSpace and GlobalAddressSpace answer GetDefaultAddressSpaces.
	// carve ignores address spaces: the overlay partitions its addresses.
	LocalAddressSpace = "CarveLocal"
	// GlobalAddressSpace: see LocalAddressSpace.
	GlobalAddressSpace = "CarveGlobal"

	// attachmentPrefix starts the container ids of Docker's attachments in
	// the IPAM, so that they are told apart from CNI's in listings.
	attachmentPrefix = "docker-"
)

// The protocol's messages (field names are Docker's, without JSON tags).
type (
	activateResponse struct {
		Implements []string
	}
	capabilitiesResponse struct {
		RequiresMACAddress    bool
		RequiresRequestReplay bool
	}
	addressSpacesResponse struct {
		LocalDefaultAddressSpace  string
		GlobalDefaultAddressSpace string
	}
	requestPoolRequest struct {
		AddressSpace string
		Pool         string
		SubPool      string
		Options      map[string]string
		V6           bool
	}
	requestPoolResponse struct {
		PoolID string
		Pool   string
		Data   map[string]string
	}
	releasePoolRequest struct {
		PoolID string
	}
	requestAddressRequest struct {
		PoolID  string
		Address string
		Options map[string]string
	}
	requestAddressResponse struct {
		Address string
		Data    map[string]string
	}
	releaseAddressRequest struct {
		PoolID  string
		Address string
	}
	errorResponse struct {
		Err string
	}
)

// poolID identifies a pool: an overlay's docker range of one family. It is
// encoded as "carve/<overlay>/<4|6>/<prefix>": the prefix lets a request on a
// pool whose range has since changed be refused instead of served from the
// new range.
type poolID struct {
	overlay string
	v6      bool
	prefix  netip.Prefix
}

func (p poolID) String() string {
	fam := "4"
	if p.v6 {
		fam = "6"
	}
	return "carve/" + p.overlay + "/" + fam + "/" + p.prefix.String()
}

// family is the IPAMRequest.Family of the pool.
func (p poolID) family() string {
	if p.v6 {
		return "6"
	}
	return "4"
}

// gateway is the bridge's address: the first host of the range.
func (p poolID) gateway() netip.Addr { return p.prefix.Masked().Addr().Next() }

func parsePoolID(s string) (poolID, error) {
	parts := strings.SplitN(s, "/", 4)
	if len(parts) != 4 || parts[0] != "carve" || parts[1] == "" {
		return poolID{}, fmt.Errorf("pool id %q is not carve's", s)
	}
	p := poolID{overlay: parts[1]}
	switch parts[2] {
	case "4":
	case "6":
		p.v6 = true
	default:
		return poolID{}, fmt.Errorf("pool id %q: bad family %q", s, parts[2])
	}
	pfx, err := netip.ParsePrefix(parts[3])
	if err != nil || pfx != pfx.Masked() || pfx.Addr().Is6() != p.v6 {
		return poolID{}, fmt.Errorf("pool id %q: bad range %q", s, parts[3])
	}
	p.prefix = pfx
	return p, nil
}

// driver implements the plugin protocol over an AddressService. Its mutex
// orders Docker's requests with the leak collector's decisions.
type driver struct {
	svc    AddressService
	log    *slog.Logger
	now    func() time.Time
	router http.Handler

	// gated closes RequestAddress while Service.Run follows an engine, until
	// ready: the engine's running containers were listed and their
	// addresses taken back (or no engine answers at the configured host, so
	// there is nothing to take back from). A driver used without Run is
	// never gated. See takeback.go.
	gated, ready atomic.Bool
	// takeBackWait bounds how long RequestAddress waits for the take-back
	// before it answers a retryable error.
	takeBackWait time.Duration
	// servedBy names the Docker network that serves an overlay's docker
	// range ("" when none is known); nil: none known.
	servedBy func(overlay string) string
	// networkTemplate names the Docker networks carve makes (Options.NetworkName).
	networkTemplate string

	mu sync.Mutex
	// waiting says, per overlay, why the addresses running containers hold
	// on it could not be taken back yet (the agent has not restored that
	// overlay): RequestAddress on it waits until they are.
	waiting map[string]string
	// changed is closed (and replaced) whenever the take-back state changes.
	changed chan struct{}
	// unusedSince is when the collector first saw an attachment held by no
	// container (key: overlay, container id, ifname). A new request for an
	// attachment clears it, so that its grace period starts over.
	unusedSince map[string]time.Time
}

func newDriver(svc AddressService, log *slog.Logger, now func() time.Time) *driver {
	d := &driver{svc: svc, log: log, now: now, unusedSince: map[string]time.Time{}, changed: make(chan struct{}), takeBackWait: DefaultTakeBackWait,
		networkTemplate: DefaultNetworkName}
	d.router = d.routes()
	return d
}

func attachmentKey(network, containerID, ifname string) string {
	return network + "\x00" + containerID + "\x00" + ifname
}

// pluginError is an error answered to Docker (the message is all it shows).
type pluginError struct{ msg string }

func (e *pluginError) Error() string { return e.msg }

func errorf(format string, args ...any) error {
	return &pluginError{msg: fmt.Sprintf(format, args...)}
}

// ServeHTTP answers Docker's plugin calls.
func (d *driver) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.router.ServeHTTP(w, r) }

var errNoEndpoint = errors.New("no such plugin endpoint")

// routes is the plugin protocol's router: one POST endpoint per call, and
// the protocol's own error shape ({"Err"}) for everything else.
func (d *driver) routes() http.Handler {
	r := httpapi.NewRouter()
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.refuse(w, r, http.StatusNotFound, fmt.Errorf("%w: %s", errNoEndpoint, r.URL.Path))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.refuse(w, r, http.StatusMethodNotAllowed, fmt.Errorf("plugin calls are POST, not %s", r.Method))
	})
	endpoints := map[string]func(body []byte) (any, error){
		"/Plugin.Activate": func([]byte) (any, error) {
			return activateResponse{Implements: []string{"IpamDriver"}}, nil
		},
		"/IpamDriver.GetCapabilities": func([]byte) (any, error) { return capabilitiesResponse{}, nil },
		"/IpamDriver.GetDefaultAddressSpaces": func([]byte) (any, error) {
			return addressSpacesResponse{LocalDefaultAddressSpace: LocalAddressSpace, GlobalDefaultAddressSpace: GlobalAddressSpace}, nil
		},
		"/IpamDriver.RequestPool": endpoint(d.requestPool),
		"/IpamDriver.ReleasePool": endpoint(func(releasePoolRequest) (struct{}, error) {
			return struct{}{}, nil // pools are the agent's ranges: nothing to free
		}),
		"/IpamDriver.RequestAddress": endpoint(d.requestAddress),
		"/IpamDriver.ReleaseAddress": endpoint(d.releaseAddress),
	}
	for path, call := range endpoints {
		r.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, httpapi.MaxBodyBytes))
			if err != nil {
				d.refuse(w, r, http.StatusBadRequest, fmt.Errorf("read request: %w", err))
				return
			}
			v, err := call(body)
			if err != nil {
				d.refuse(w, r, http.StatusInternalServerError, err)
				return
			}
			writePlugin(w, http.StatusOK, v)
		}).Methods(http.MethodPost)
	}
	return r
}

// endpoint adapts a call to the router: it decodes Docker's request body.
func endpoint[Req, Resp any](call func(Req) (Resp, error)) func(body []byte) (any, error) {
	return func(body []byte) (any, error) {
		var req Req
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		return call(req)
	}
}

// refuse answers a call with the protocol's error shape.
func (d *driver) refuse(w http.ResponseWriter, r *http.Request, status int, err error) {
	d.log.Warn("docker ipam call refused", "call", r.URL.Path, "err", err)
	writePlugin(w, status, errorResponse{Err: err.Error()})
}

// decode reads a request body. Unknown fields are ignored (the protocol is
// Docker's and may grow); an empty body is an empty request.
func decode(body []byte, v any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errorf("bad request body: %v", err)
	}
	return nil
}

func writePlugin(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// dockerOverlays are the overlays that have a docker bridge on this agent.
func (d *driver) dockerOverlays() []string {
	var out []string
	for _, n := range d.svc.Networks() {
		if _, _, ok := d.svc.BridgeSubnets(n, api.BridgeDocker); ok {
			out = append(out, n)
		}
	}
	return out
}

// pool resolves an overlay's docker range of one family.
func (d *driver) pool(overlay string, v6 bool) (poolID, error) {
	v4p, v6p, ok := d.svc.BridgeSubnets(overlay, api.BridgeDocker)
	if !ok {
		if slices.Contains(d.svc.Networks(), overlay) {
			return poolID{}, errorf("overlay %q has no docker bridge on this agent (start the agent with --docker-bridge=true)", overlay)
		}
		return poolID{}, errorf("overlay %q is not configured on this agent (yet); it serves %s", overlay, listOrNone(d.dockerOverlays()))
	}
	p := poolID{overlay: overlay, v6: v6, prefix: v4p}
	if v6 {
		p.prefix = v6p
	}
	if !p.prefix.IsValid() {
		fam := "IPv4"
		if v6 {
			fam = "IPv6"
		}
		return poolID{}, errorf("overlay %q has no %s range on its docker bridge", overlay, fam)
	}
	p.prefix = p.prefix.Masked()
	return p, nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "no overlay"
	}
	return strings.Join(names, ", ")
}

func (d *driver) requestPool(req requestPoolRequest) (*requestPoolResponse, error) {
	overlay := req.Options[OptionNetwork]
	if overlay == "" {
		ovs := d.dockerOverlays()
		if len(ovs) != 1 {
			return nil, errorf("name the carve overlay with --ipam-opt %s=<overlay> (this agent serves %s)", OptionNetwork, listOrNone(ovs))
		}
		overlay = ovs[0]
	}
	p, err := d.pool(overlay, req.V6)
	if err != nil {
		return nil, err
	}
	if req.Pool == "" && !req.V6 {
		// dockerd checks an IPv4 pool it did not name against the host's
		// routes: the range is routed on carve's bridge d-<overlay>, so it
		// gives the pool back and asks again, forever (docker network
		// create hangs). Refuse, naming the network to use instead.
		name := d.networkServing(overlay)
		return nil, errorf("overlay %q's docker range %s is carve's Docker network %q: run containers on it with docker run --net %s (a network of your own on that range cannot work: it is routed on carve's bridge %s)", overlay, p.prefix, name, name, BridgeName(overlay))
	}
	if req.Pool != "" {
		want, err := netip.ParsePrefix(req.Pool)
		if err != nil {
			return nil, errorf("pool %q is not a CIDR", req.Pool)
		}
		// The pool must be the whole range: Docker gives the bridge the
		// gateway with the pool's prefix length, and carve's bridge d-<overlay>
		// already carries the range's gateway.
		if want.Masked() != p.prefix {
			name := d.networkServing(overlay)
			return nil, errorf("pool %s is not the docker range %s of overlay %q on this agent: run containers on carve's Docker network for it with docker run --net %s", want, p.prefix, overlay, name)
		}
	}
	if req.SubPool != "" {
		return nil, errorf("--ip-range %s is not supported: carve hands out the lowest free address of the docker range %s", req.SubPool, p.prefix)
	}
	gw := netip.PrefixFrom(p.gateway(), p.prefix.Bits())
	return &requestPoolResponse{PoolID: p.String(), Pool: p.prefix.String(), Data: map[string]string{optGatewayType: gw.String()}}, nil
}

// currentPool parses a pool id and checks that the agent still has that range.
func (d *driver) currentPool(id string) (poolID, error) {
	p, err := parsePoolID(id)
	if err != nil {
		return poolID{}, errorf("%v", err)
	}
	now, err := d.pool(p.overlay, p.v6)
	if err != nil {
		return poolID{}, err
	}
	if now.prefix != p.prefix {
		return poolID{}, errorf("the Docker network's range %s of overlay %q is stale: this agent's docker range is now %s (remove the Docker network; carve recreates it)", p.prefix, p.overlay, now.prefix)
	}
	return p, nil
}

func (d *driver) requestAddress(req requestAddressRequest) (*requestAddressResponse, error) {
	p, err := d.currentPool(req.PoolID)
	if err != nil {
		return nil, err
	}
	var want netip.Addr
	if req.Address != "" {
		if want, err = parseAddr(req.Address); err != nil {
			return nil, errorf("address %q is not an IP address", req.Address)
		}
		if want.Is6() != p.v6 {
			return nil, errorf("address %s is not in the pool's family (%s)", want, p.prefix)
		}
	}
	if req.Options[optRequestAddressType] == optGatewayType {
		// The gateway is carve's bridge address: never allocated, and no
		// other address will do (Docker would move the bridge's address).
		gw := p.gateway()
		if want.IsValid() && want != gw {
			return nil, errorf("the gateway of overlay %q's docker range %s is %s (carve's bridge address), not %s", p.overlay, p.prefix, gw, want)
		}
		return &requestAddressResponse{Address: netip.PrefixFrom(gw, p.prefix.Bits()).String(), Data: map[string]string{}}, nil
	}
	if want.IsValid() && !p.prefix.Contains(want) {
		return nil, errorf("address %s is outside overlay %q's docker range %s", want, p.overlay, p.prefix)
	}
	if err := d.awaitTakeBack(p.overlay); err != nil {
		return nil, err
	}
	areq := api.IPAMRequest{Network: p.overlay, IfName: "eth0", Bridge: api.BridgeDocker, Family: p.family()}
	if p.v6 {
		// One attachment per family: Allocate is idempotent per attachment
		// and would answer a v6 request with the v4 record.
		areq.IfName = "eth0-v6"
	}
	// Docker names neither the container nor the endpoint in the request:
	// the owner is the runtime and the endpoint's MAC address.
	areq.Owner = &api.Owner{Runtime: api.RuntimeDocker}
	if mac, err := net.ParseMAC(req.Options[optMACAddress]); err == nil && len(mac) == 6 {
		areq.ContainerID = attachmentPrefix + strings.ReplaceAll(mac.String(), ":", "")
		areq.Owner.MAC = mac.String()
	} else {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, errorf("attachment id: %v", err)
		}
		areq.ContainerID = attachmentPrefix + hex.EncodeToString(b[:])
	}
	if want.IsValid() {
		areq.Address = want.String()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	alloc, err := d.svc.Allocate(areq)
	if err != nil {
		return nil, errorf("allocate on overlay %q: %v", p.overlay, err)
	}
	delete(d.unusedSince, attachmentKey(areq.Network, areq.ContainerID, areq.IfName))
	for _, ip := range alloc.IPs {
		a, err := netip.ParsePrefix(ip.Address)
		if err == nil && a.Addr().Is6() == p.v6 {
			return &requestAddressResponse{Address: netip.PrefixFrom(a.Addr(), p.prefix.Bits()).String(), Data: map[string]string{}}, nil
		}
	}
	// Not expected: give the attachment back rather than leak it.
	_, _ = d.svc.Release(areq)
	return nil, errorf("the agent allocated no IPv%s address for %s on overlay %q", p.family(), areq.ContainerID, p.overlay)
}

func (d *driver) releaseAddress(req releaseAddressRequest) (struct{}, error) {
	p, err := parsePoolID(req.PoolID)
	if err != nil {
		return struct{}{}, errorf("%v", err)
	}
	addr, err := parseAddr(req.Address)
	if err != nil {
		return struct{}{}, errorf("address %q is not an IP address", req.Address)
	}
	// Only addresses of the pool's range: never another bridge's attachment.
	// Docker also releases gateways it never asked for: releasing what
	// nobody holds is no error.
	if !p.prefix.Contains(addr) || addr == p.gateway() {
		return struct{}{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rel, err := d.svc.ReleaseAddress(p.overlay, addr)
	if err != nil {
		return struct{}{}, errorf("release %s on overlay %q: %v", addr, p.overlay, err)
	}
	for _, a := range rel.Released {
		delete(d.unusedSince, attachmentKey(a.Network, a.ContainerID, a.IfName))
	}
	return struct{}{}, nil
}

// parseAddr accepts an address with or without a prefix length.
func parseAddr(s string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	if a.Zone() != "" {
		return netip.Addr{}, errors.New("zoned address")
	}
	return a, nil
}
