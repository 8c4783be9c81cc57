package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// IPAM buckets in the agent's store. An allocation is one key, written and
// fsynced before the answer, so that after a crash at any point a restarted
// agent holds every address it ever gave out and not yet took back.
const (
	ipamAllocBucket = "ipam-allocations" // "<overlay>\x00<container>\x00<ifname>" -> allocRecord
	ipamRingBucket  = "ipam-rings"       // "<overlay>/<family>" -> ring encoding
)

// allocRecord is a persisted attachment.
type allocRecord struct {
	Bridge string     `json:"bridge"`
	V4     netip.Addr `json:"v4,omitzero"`
	V6     netip.Addr `json:"v6,omitzero"`
}

func allocKey(network string, at ring.Attachment) []byte {
	return []byte(network + "\x00" + at.ContainerID + "\x00" + at.Interface)
}

func parseAllocKey(k []byte) (string, ring.Attachment, bool) {
	parts := strings.SplitN(string(k), "\x00", 3)
	if len(parts) != 3 {
		return "", ring.Attachment{}, false
	}
	return parts[0], ring.Attachment{ContainerID: parts[1], Interface: parts[2]}, true
}

// overlayIPAM is the address space of one overlay on this agent: one ring
// allocator per address family, seeded from the masters' leases.
type overlayIPAM struct {
	name     string
	alloc4   *ring.Allocator
	alloc6   *ring.Allocator
	bridges  map[string][2]netip.Prefix // bridge kind -> v4, v6 sub-subnet
	attached map[ring.Attachment]allocRecord
	// seedErr is why the ring refused the masters' leases; while it is set
	// the ring may own nothing, and "exhausted" would mislead.
	seedErr error
}

// attachedTo returns an attachment's record (nil-safe).
func (o *overlayIPAM) attachedTo(at ring.Attachment) (allocRecord, bool) {
	if o == nil {
		return allocRecord{}, false
	}
	rec, ok := o.attached[at]
	return rec, ok
}

// IPAM serves container addresses out of the ranges this agent owns.
type IPAM struct {
	a   *Agent
	log *slog.Logger
	db  *bolt.DB

	mu       sync.Mutex // serialises changes and their persistence
	overlays map[string]*overlayIPAM
	persist  map[string]map[ring.Attachment]allocRecord // loaded from disk, claimed as overlays appear
	mtu      int
	// grower, when set, is asked for more space when a bridge is full.
	grower Grower
}

func newIPAM(a *Agent) (*IPAM, error) {
	s := &IPAM{a: a, log: a.log.With("component", "ipam"), db: a.store.DB(),
		overlays: map[string]*overlayIPAM{}, persist: map[string]map[ring.Attachment]allocRecord{}}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{ipamAllocBucket, ipamRingBucket} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte(ipamAllocBucket)).ForEach(func(k, v []byte) error {
			network, at, ok := parseAllocKey(k)
			var rec allocRecord
			if !ok || json.Unmarshal(v, &rec) != nil {
				return fmt.Errorf("corrupt allocation record %q", k)
			}
			if s.persist[network] == nil {
				s.persist[network] = map[ring.Attachment]allocRecord{}
			}
			s.persist[network][at] = rec
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("ipam: load allocations: %w", err)
	}
	n := 0
	for _, m := range s.persist {
		n += len(m)
	}
	if n > 0 {
		s.log.Info("loaded allocations", "count", n)
	}
	return s, nil
}

// sync brings the overlays' allocators in line with this agent's leases and
// everyone's (from membership): new overlays get an allocator, the ring is
// re-seeded, and persisted allocations are claimed back before any new one.
// It reports whether a ring changed (to be gossiped).
func (s *IPAM) sync(self *api.AgentInfo, network *api.NetworkConfig, members MembershipState) (ringChanged bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mtu = defaultOverlayMTU
	if network != nil && network.OverlayMTU > 0 {
		s.mtu = network.OverlayMTU
	}
	for _, ov := range self.Overlays {
		if ov.State.Status != api.StatusOK || (ov.Subnet == "" && ov.Subnet6 == "") {
			continue
		}
		o := s.overlays[ov.Info.Name]
		if o == nil {
			o = &overlayIPAM{name: ov.Info.Name, attached: map[ring.Attachment]allocRecord{}}
		}
		o.bridges = map[string][2]netip.Prefix{}
		for kind, br := range map[string]*api.BridgeInfo{api.BridgeMesos: ov.MesosBridge, api.BridgeDocker: ov.DockerBridge} {
			if br == nil {
				continue
			}
			var p [2]netip.Prefix
			p[0], _ = netip.ParsePrefix(br.IP)
			p[1], _ = netip.ParsePrefix(br.IP6)
			o.bridges[kind] = p
		}
		var err4, err6 error
		var ch4, ch6 bool
		o.alloc4, ch4, err4 = s.seed(o.alloc4, ov.Info.Name, "4", ov.Info.Subnet, members)
		o.alloc6, ch6, err6 = s.seed(o.alloc6, ov.Info.Name, "6", ov.Info.Subnet6, members)
		ringChanged = ringChanged || ch4 || ch6
		if o.seedErr = errors.Join(err4, err6); o.seedErr != nil {
			s.log.Error("the ring refused the masters' leases", "overlay", ov.Info.Name, "err", o.seedErr)
		}
		if s.overlays[ov.Info.Name] == nil {
			s.overlays[ov.Info.Name] = o
			s.claimPersisted(o)
			s.reclaimFromCNICache(o)
		}
	}
	return ringChanged
}

// seed creates (or re-seeds) the allocator of one overlay family.
func (s *IPAM) seed(alloc *ring.Allocator, overlay, family, universe string, members MembershipState) (*ring.Allocator, bool, error) {
	if universe == "" {
		return nil, false, nil
	}
	u, err := netip.ParsePrefix(universe)
	if err != nil {
		return alloc, false, fmt.Errorf("universe %q: %w", universe, err)
	}
	fresh := alloc == nil
	if fresh {
		if alloc, err = ring.NewAllocator(s.a.id, u); err != nil {
			return nil, false, err
		}
	}
	var leases []ring.Lease
	for _, r := range members.Records {
		for _, sub := range r.Subnets {
			p, err := netip.ParsePrefix(sub)
			if err == nil && u.Contains(p.Addr()) && p.Bits() > u.Bits() {
				leases = append(leases, ring.Lease{Owner: r.ID, Prefix: p, Version: r.Version})
			}
		}
	}
	var tombs []ring.Tombstone
	for _, t := range members.Tombstones {
		tombs = append(tombs, ring.Tombstone{Owner: t.AgentID, Version: t.Version})
	}
	changed, err := alloc.Seed(leases, tombs)
	if err != nil {
		return alloc, false, err
	}
	if fresh {
		// Grants made through the ring live only in the ring: merge the
		// persisted one back.
		var saved []byte
		_ = s.db.View(func(tx *bolt.Tx) error {
			saved = bytes.Clone(tx.Bucket([]byte(ipamRingBucket)).Get([]byte(overlay + "/" + family)))
			return nil
		})
		if saved != nil {
			if merged, err := alloc.MergeEncoded(saved); err != nil {
				s.log.Warn("persisted ring not merged", "overlay", overlay, "family", family, "err", err)
			} else {
				changed = changed || merged
			}
		}
	}
	if changed || fresh {
		enc := alloc.EncodeRing()
		if err := s.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(ipamRingBucket)).Put([]byte(overlay+"/"+family), enc)
		}); err != nil {
			return alloc, changed, fmt.Errorf("persist ring: %w", err)
		}
	}
	return alloc, changed || fresh, nil
}

// claimPersisted takes back the addresses of persisted allocations.
func (s *IPAM) claimPersisted(o *overlayIPAM) {
	for at, rec := range s.persist[o.name] {
		var errs []error
		if rec.V4.IsValid() && o.alloc4 != nil {
			errs = append(errs, o.alloc4.Claim(at, rec.V4))
		}
		if rec.V6.IsValid() && o.alloc6 != nil {
			errs = append(errs, o.alloc6.Claim(at, rec.V6))
		}
		if err := errors.Join(errs...); err != nil {
			// Keep the record: the container may still use the address,
			// and a later lease or grant can make it claimable again.
			s.log.Error("persisted allocation not claimable", "overlay", o.name, "container", at.ContainerID, "ifname", at.Interface, "err", err)
			continue
		}
		o.attached[at] = rec
		delete(s.persist[o.name], at)
	}
}

var containerIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,254}$`)

// validate checks an IPAM request and names the bad field.
func validateIPAMRequest(req *api.IPAMRequest, needIf bool) error {
	if req.Network == "" {
		return errors.New("network is required (the overlay name)")
	}
	if !containerIDRE.MatchString(req.ContainerID) || strings.Contains(req.ContainerID, "\x00") {
		return fmt.Errorf("container_id %q: want 1-255 printable characters", req.ContainerID)
	}
	if needIf && (req.IfName == "" || len(req.IfName) > 15 || strings.ContainsAny(req.IfName, "/ \x00:")) {
		return fmt.Errorf("ifname %q is not an interface name", req.IfName)
	}
	switch req.Bridge {
	case "":
		req.Bridge = api.BridgeMesos
	case api.BridgeMesos, api.BridgeDocker:
	default:
		return fmt.Errorf("bridge %q: want %q or %q", req.Bridge, api.BridgeMesos, api.BridgeDocker)
	}
	if req.Address != "" {
		if _, err := netip.ParseAddr(req.Address); err != nil {
			return fmt.Errorf("address %q is not an IP address", req.Address)
		}
	}
	if req.Family != "" && req.Family != "4" && req.Family != "6" {
		return fmt.Errorf("family %q: want 4, 6 or empty", req.Family)
	}
	return nil
}

// ipamError is an error with its HTTP status and code.
type ipamError struct {
	status int
	code   string
	msg    string
}

func (e *ipamError) Error() string { return e.msg }

func ipamErr(status int, code, format string, args ...any) error {
	return &ipamError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

// overlayFor returns the overlay's IPAM, or an error saying why there is none.
func (s *IPAM) overlayFor(name string) (*overlayIPAM, error) {
	if o := s.overlays[name]; o != nil {
		if o.seedErr != nil {
			return nil, ipamErr(http.StatusServiceUnavailable, api.CodeNotReady, "overlay %q: the address ring refused the masters' leases: %v", name, o.seedErr)
		}
		return o, nil
	}
	s.a.mu.RLock()
	self := s.a.self
	s.a.mu.RUnlock()
	if self == nil {
		return nil, ipamErr(http.StatusServiceUnavailable, api.CodeNotReady, "this agent has no lease yet (not registered with a master)")
	}
	if ov := self.Overlay(name); ov != nil {
		if ov.State.Status == api.StatusOK {
			// Leased, but the allocator is not built yet (the agent is
			// starting and restoring its allocations): retry shortly.
			return nil, ipamErr(http.StatusServiceUnavailable, api.CodeNotReady, "overlay %q is starting up: its allocations are being restored", name)
		}
		msg := fmt.Sprintf("overlay %q is %s here", name, ov.State.Status)
		if ov.State.Error != "" {
			msg += ": " + ov.State.Error
		}
		return nil, ipamErr(http.StatusServiceUnavailable, api.CodeNotReady, "%s", msg)
	}
	return nil, ipamErr(http.StatusNotFound, api.CodeNotFound, "unknown network %q (this agent has no such overlay)", name)
}

// Allocate gives an attachment its addresses (the same ones on a repeat).
func (s *IPAM) Allocate(req api.IPAMRequest) (*api.Allocation, error) {
	if err := validateIPAMRequest(&req, true); err != nil {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	a, err := s.allocate(req)
	var ie *ipamError
	if grower := s.grower; grower != nil && errors.As(err, &ie) && ie.code == api.CodeExhausted {
		// The seam for growth: get more space outside the lock, then retry once.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if gerr := grower.Grow(ctx, req.Network, req.Bridge); gerr != nil {
			return nil, ipamErr(http.StatusConflict, api.CodeExhausted, "%s; no more space: %v", ie.msg, gerr)
		}
		return s.allocate(req)
	}
	return a, err
}

// Grower obtains more address space for an overlay whose bridge is full:
// another lease from the masters, or a CIDR-aligned grant from a peer
// through the ring (ring.Allocator.Donate on the donor, ringgossip's
// request/answer exchange), after which sync or a ring merge gives the
// allocator the new range and the dataplane routes it. None is wired today:
// a full bridge answers "exhausted".
type Grower interface {
	Grow(ctx context.Context, overlay, bridge string) error
}

// allocate is Allocate under the lock.
func (s *IPAM) allocate(req api.IPAMRequest) (*api.Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.overlayFor(req.Network)
	if err != nil {
		return nil, err
	}
	at := ring.Attachment{ContainerID: req.ContainerID, Interface: req.IfName}
	if rec, ok := o.attached[at]; ok {
		if rec.Bridge != req.Bridge {
			return nil, ipamErr(http.StatusConflict, api.CodeConflict, "%s/%s already holds addresses on the %s bridge", at.ContainerID, at.Interface, rec.Bridge)
		}
		return s.allocation(o, at, rec), nil
	}
	subnets, ok := o.bridges[req.Bridge]
	if !ok {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "this agent has no %s bridge on %q (see --%s-bridge)", req.Bridge, req.Network, req.Bridge)
	}
	var claim netip.Addr
	if req.Address != "" {
		claim = netip.MustParseAddr(req.Address)
	}
	rec := allocRecord{Bridge: req.Bridge}
	for i, fam := range []struct {
		alloc  *ring.Allocator
		subnet netip.Prefix
		dst    *netip.Addr
		name   string
	}{{o.alloc4, subnets[0], &rec.V4, "4"}, {o.alloc6, subnets[1], &rec.V6, "6"}} {
		if fam.alloc == nil || !fam.subnet.IsValid() || (req.Family != "" && req.Family != fam.name) {
			continue
		}
		var addr netip.Addr
		var err error
		if claim.IsValid() && claim.Is4() == (i == 0) {
			if !fam.subnet.Contains(claim) {
				err = fmt.Errorf("%w: %s is outside the %s bridge's %s", ring.ErrNotOwned, claim, req.Bridge, fam.subnet)
			} else if err = fam.alloc.Claim(at, claim); err == nil {
				addr = claim
			}
		} else {
			addr, err = fam.alloc.Allocate(at, fam.subnet)
		}
		if err != nil {
			if rec.V4.IsValid() {
				o.alloc4.Release(at)
			}
			return nil, allocError(err, req.Bridge, fam.subnet, claim)
		}
		*fam.dst = addr
	}
	if !rec.V4.IsValid() && !rec.V6.IsValid() {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "no address family to allocate from on %q (family %q)", req.Network, req.Family)
	}
	if err := s.save(req.Network, at, &rec); err != nil {
		s.releaseMem(o, at)
		return nil, ipamErr(http.StatusInternalServerError, api.CodeInternal, "persist allocation: %v", err)
	}
	o.attached[at] = rec
	s.a.metrics.ipamOps.WithLabelValues("allocate").Inc()
	return s.allocation(o, at, rec), nil
}

func allocError(err error, bridge string, subnet netip.Prefix, claim netip.Addr) error {
	switch {
	case errors.Is(err, ring.ErrFull):
		return ipamErr(http.StatusConflict, api.CodeExhausted, "exhausted: the %s bridge's %s has no free address", bridge, subnet)
	case errors.Is(err, ring.ErrAddressInUse):
		return ipamErr(http.StatusConflict, api.CodeTaken, "address %s is held by another container", claim)
	case errors.Is(err, ring.ErrNotOwned), errors.Is(err, ring.ErrOutside):
		return ipamErr(http.StatusConflict, api.CodeConflict, "address %s is not this agent's to give: %v", claim, err)
	default:
		return ipamErr(http.StatusInternalServerError, api.CodeInternal, "allocate in %s: %v", subnet, err)
	}
}

func (s *IPAM) releaseMem(o *overlayIPAM, at ring.Attachment) {
	if o.alloc4 != nil {
		o.alloc4.Release(at)
	}
	if o.alloc6 != nil {
		o.alloc6.Release(at)
	}
	delete(o.attached, at)
}

// save persists (rec != nil) or deletes an allocation, fsynced.
func (s *IPAM) save(network string, at ring.Attachment, rec *allocRecord) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(ipamAllocBucket))
		if rec == nil {
			return b.Delete(allocKey(network, at))
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return b.Put(allocKey(network, at), data)
	})
}

// allocation renders an attachment's addresses with gateways and routes.
func (s *IPAM) allocation(o *overlayIPAM, at ring.Attachment, rec allocRecord) *api.Allocation {
	out := &api.Allocation{Network: o.name, ContainerID: at.ContainerID, IfName: at.Interface, Bridge: rec.Bridge, MTU: s.mtu}
	subnets := o.bridges[rec.Bridge]
	for i, addr := range []netip.Addr{rec.V4, rec.V6} {
		if !addr.IsValid() {
			continue
		}
		sub := subnets[i]
		gw := sub.Masked().Addr().Next()
		out.IPs = append(out.IPs, api.IPConfig{Address: netip.PrefixFrom(addr, sub.Bits()).String(), Gateway: gw.String()})
		dst := "0.0.0.0/0"
		if i == 1 {
			dst = "::/0"
		}
		out.Routes = append(out.Routes, api.Route{Dst: dst, GW: gw.String()})
	}
	return out
}

// Release frees an attachment's addresses; releasing nothing succeeds.
func (s *IPAM) Release(req api.IPAMRequest) (*api.Released, error) {
	if err := validateIPAMRequest(&req, true); err != nil {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Released{Released: []api.Allocation{}}
	o := s.overlays[req.Network]
	at := ring.Attachment{ContainerID: req.ContainerID, Interface: req.IfName}
	if _, attached := o.attachedTo(at); o == nil || !attached {
		// Not claimed (the overlay is not configured yet, or the address was
		// not claimable): drop the persisted record so it is not claimed later.
		if rec, ok := s.persist[req.Network][at]; ok {
			if err := s.save(req.Network, at, nil); err != nil {
				return nil, ipamErr(http.StatusInternalServerError, api.CodeInternal, "persist release: %v", err)
			}
			delete(s.persist[req.Network], at)
			out.Released = append(out.Released, api.Allocation{Network: req.Network, ContainerID: at.ContainerID, IfName: at.Interface, Bridge: rec.Bridge})
		}
		return out, nil
	}
	rec := o.attached[at]
	if err := s.save(req.Network, at, nil); err != nil {
		return nil, ipamErr(http.StatusInternalServerError, api.CodeInternal, "persist release: %v", err)
	}
	out.Released = append(out.Released, *s.allocation(o, at, rec))
	s.releaseMem(o, at)
	s.a.metrics.ipamOps.WithLabelValues("release").Inc()
	return out, nil
}

// ReleaseAddress frees whichever attachment holds addr on the network
// (Docker's ReleaseAddress names only the address). An address nobody holds
// is no error: Docker also releases gateways it never asked us for.
func (s *IPAM) ReleaseAddress(network string, addr netip.Addr) (*api.Released, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Released{Released: []api.Allocation{}}
	o := s.overlays[network]
	if o == nil {
		return out, nil
	}
	for _, at := range sortedAttachments(o.attached) {
		rec := o.attached[at]
		if rec.V4 != addr && rec.V6 != addr {
			continue
		}
		if err := s.save(network, at, nil); err != nil {
			return nil, ipamErr(http.StatusInternalServerError, api.CodeInternal, "persist release: %v", err)
		}
		out.Released = append(out.Released, *s.allocation(o, at, rec))
		s.releaseMem(o, at)
		s.a.metrics.ipamOps.WithLabelValues("release").Inc()
	}
	return out, nil
}

// Networks names the overlays this agent can allocate on now.
func (s *IPAM) Networks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sortedKeys(s.overlays)
}

// BridgeSubnets returns a bridge's IPv4 and IPv6 sub-subnets on an overlay
// (an invalid prefix where the family is absent), and false when this agent
// has no such bridge.
func (s *IPAM) BridgeSubnets(network, bridge string) (v4, v6 netip.Prefix, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[network]
	if o == nil {
		return netip.Prefix{}, netip.Prefix{}, false
	}
	p, ok := o.bridges[bridge]
	return p[0], p[1], ok
}

// Lookup returns an attachment's addresses.
func (s *IPAM) Lookup(req api.IPAMRequest) (*api.Allocation, error) {
	if err := validateIPAMRequest(&req, true); err != nil {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	at := ring.Attachment{ContainerID: req.ContainerID, Interface: req.IfName}
	o, err := s.overlayFor(req.Network)
	if err != nil {
		// Not restored yet (not_ready), or an unknown network (not_found):
		// never "no addresses" for an attachment that may hold some.
		return nil, err
	}
	if rec, ok := o.attached[at]; ok {
		return s.allocation(o, at, rec), nil
	}
	if _, pending := s.persist[req.Network][at]; pending {
		return nil, ipamErr(http.StatusServiceUnavailable, api.CodeNotReady, "%s/%s holds a persisted address that is not claimable yet", req.ContainerID, req.IfName)
	}
	return nil, ipamErr(http.StatusNotFound, api.CodeNotFound, "no addresses for %s/%s on %q", req.ContainerID, req.IfName, req.Network)
}

// List returns the allocations of a network (every network when empty).
func (s *IPAM) List(network string) *api.Allocations {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Allocations{Allocations: []api.Allocation{}}
	for _, name := range sortedKeys(s.overlays) {
		if network != "" && name != network {
			continue
		}
		o := s.overlays[name]
		ats := make([]ring.Attachment, 0, len(o.attached))
		for at := range o.attached {
			ats = append(ats, at)
		}
		slices.SortFunc(ats, func(a, b ring.Attachment) int {
			return strings.Compare(a.ContainerID+"\x00"+a.Interface, b.ContainerID+"\x00"+b.Interface)
		})
		for _, at := range ats {
			out.Allocations = append(out.Allocations, *s.allocation(o, at, o.attached[at]))
		}
	}
	return out
}

// GC releases every allocation of the network whose attachment is not kept.
func (s *IPAM) GC(req api.GCRequest) (*api.Released, error) {
	if req.Network == "" {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "network is required")
	}
	if req.Bridge != "" && req.Bridge != api.BridgeMesos && req.Bridge != api.BridgeDocker {
		return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "bridge %q: want %q, %q or empty", req.Bridge, api.BridgeMesos, api.BridgeDocker)
	}
	keep := map[ring.Attachment]bool{}
	keepAll := map[string]bool{}
	for i, k := range req.Keep {
		if k.ContainerID == "" {
			return nil, ipamErr(http.StatusBadRequest, api.CodeBadRequest, "keep[%d].container_id is empty", i)
		}
		if k.IfName == "" {
			keepAll[k.ContainerID] = true
		}
		keep[ring.Attachment{ContainerID: k.ContainerID, Interface: k.IfName}] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Released{Released: []api.Allocation{}}
	o := s.overlays[req.Network]
	if o == nil {
		return out, nil
	}
	for _, at := range sortedAttachments(o.attached) {
		rec := o.attached[at]
		if keep[at] || keepAll[at.ContainerID] || (req.Bridge != "" && rec.Bridge != req.Bridge) {
			continue
		}
		if err := s.save(req.Network, at, nil); err != nil {
			return out, ipamErr(http.StatusInternalServerError, api.CodeInternal, "persist gc: %v", err)
		}
		out.Released = append(out.Released, *s.allocation(o, at, rec))
		s.releaseMem(o, at)
	}
	if len(out.Released) > 0 {
		s.log.Info("gc released stale allocations", "network", req.Network, "count", len(out.Released))
		s.a.metrics.ipamOps.WithLabelValues("gc_release").Add(float64(len(out.Released)))
	}
	return out, nil
}

// Status tells whether allocations on the network can work now.
func (s *IPAM) Status(network string) *api.IPAMStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &api.IPAMStatus{Network: network}
	o, err := s.overlayFor(network)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	st.Ready = true
	st.Free = map[string]uint64{}
	for kind, subs := range o.bridges {
		if !subs[0].IsValid() {
			continue
		}
		size := uint64(1) << uint(32-subs[0].Bits())
		used := uint64(3) // network, gateway, broadcast
		for _, rec := range o.attached {
			if rec.Bridge == kind && rec.V4.IsValid() {
				used++
			}
		}
		if size > used {
			st.Free[kind] = size - used
		} else {
			st.Free[kind] = 0
		}
	}
	return st
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedAttachments(m map[ring.Attachment]allocRecord) []ring.Attachment {
	out := make([]ring.Attachment, 0, len(m))
	for at := range m {
		out = append(out, at)
	}
	slices.SortFunc(out, func(a, b ring.Attachment) int {
		return strings.Compare(a.ContainerID+"\x00"+a.Interface, b.ContainerID+"\x00"+b.Interface)
	})
	return out
}

// --- the unix socket server ---

func (s *IPAM) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /ipam/allocate", func(w http.ResponseWriter, r *http.Request) {
		var req api.IPAMRequest
		if decodeIPAM(w, r, &req) {
			v, err := s.Allocate(req)
			reply(w, v, err)
		}
	})
	mux.HandleFunc("POST /ipam/release", func(w http.ResponseWriter, r *http.Request) {
		var req api.IPAMRequest
		if decodeIPAM(w, r, &req) {
			v, err := s.Release(req)
			reply(w, v, err)
		}
	})
	mux.HandleFunc("POST /ipam/gc", func(w http.ResponseWriter, r *http.Request) {
		var req api.GCRequest
		if decodeIPAM(w, r, &req) {
			v, err := s.GC(req)
			reply(w, v, err)
		}
	})
	mux.HandleFunc("GET /ipam/lookup", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		v, err := s.Lookup(api.IPAMRequest{Network: q.Get("network"), ContainerID: q.Get("container_id"), IfName: q.Get("ifname")})
		reply(w, v, err)
	})
	mux.HandleFunc("GET /ipam/allocations", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.List(r.URL.Query().Get("network")))
	})
	mux.HandleFunc("GET /ipam/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Status(r.URL.Query().Get("network")))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, api.Error{Message: "no such endpoint: " + r.Method + " " + r.URL.Path, Code: api.CodeNotFound})
	})
	return mux
}

// decodeIPAM strictly decodes a body (1 MiB at most); false means an error was written.
func decodeIPAM(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, api.Error{Message: "bad request body: " + err.Error(), Code: api.CodeBadRequest})
		return false
	}
	return true
}

func reply[T any](w http.ResponseWriter, v T, err error) {
	if err != nil {
		var ie *ipamError
		if errors.As(err, &ie) {
			writeJSON(w, ie.status, api.Error{Message: ie.msg, Code: ie.code})
			return
		}
		writeJSON(w, http.StatusInternalServerError, api.Error{Message: err.Error(), Code: api.CodeInternal})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// serveIPAM serves the IPAM socket until ctx ends.
func (s *IPAM) serve(ctx context.Context, ln net.Listener) {
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error("ipam socket stopped", "err", err)
	}
}
