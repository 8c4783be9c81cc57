package vxlan

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/api"
)

// Protocol is the rtm_protocol / NDA_PROTOCOL value that marks the routes and
// neighbour entries carve creates. Only entries carrying it are ever removed,
// so routes and neighbours that an operator (or another daemon) added survive
// every reconcile. 202 is unassigned in /etc/iproute2/rt_protos.
const Protocol = 202

// OwnerAlias is the interface alias (IFLA_IFALIAS) that marks links carve
// created (its VTEP and bridges). A bridge carrying it that the desired state
// no longer names is deleted; links without it are never deleted.
const OwnerAlias = "carve"

// VTEP is the desired VXLAN tunnel endpoint of this agent.
type VTEP struct {
	// Name of the VXLAN device (e.g. "vtep1024"), at most 15 bytes.
	Name string
	// VNI is the VXLAN network identifier (24 bits).
	VNI uint32
	// Port is the UDP destination port (e.g. 4789).
	Port uint16
	// Local is this agent's underlay IP, the source of encapsulated packets.
	Local netip.Addr
	// MAC is the leased VTEP MAC.
	MAC net.HardwareAddr
	// MTU of the device (e.g. 1450).
	MTU int
	// Address is the VTEP IPv4 address with the VTEP subnet's prefix
	// (e.g. 100.64.0.2/16).
	Address netip.Prefix
	// Address6 optionally adds the IPv6 VTEP address with vtep_subnet6's
	// prefix (e.g. fd01:a::2/64, DC/OS's vtep_ip6): it makes the subnet
	// connected on the VTEP, where peers' VTEPIP6 get neighbour entries.
	Address6 netip.Prefix
}

// addresses returns the addresses the VTEP should carry.
func (v *VTEP) addresses() []netip.Prefix {
	out := []netip.Prefix{v.Address}
	if v.Address6.IsValid() {
		out = append(out, v.Address6)
	}
	return out
}

// Peer is another agent whose containers are reached through the overlay.
type Peer struct {
	// ID identifies the agent; it names the peer in errors and logs.
	ID string
	// UnderlayIP is the agent's IP, the VXLAN destination. A peer without
	// one (an agent that lost its IP to a newer registration) is skipped.
	UnderlayIP netip.Addr
	// VTEPIP is the agent's VTEP IPv4 address (no prefix).
	VTEPIP netip.Addr
	// VTEPMAC is the agent's VTEP MAC.
	VTEPMAC net.HardwareAddr
	// VTEPIP6 is the agent's IPv6 VTEP address (no prefix), or invalid: it
	// gets a neighbour entry (VTEPIP6 -> VTEPMAC) so that it is reachable
	// over the VTEP subnet6 that VTEP.Address6 makes connected.
	VTEPIP6 netip.Addr
	// Subnets are routed to the agent, one per overlay (IPv4, and IPv6 for
	// overlays that have subnet6). IPv6 subnets are routed via the peer's
	// IPv6 link-local VTEP address derived from VTEPMAC (see LinkLocal),
	// because Linux cannot route IPv6 via an IPv4 next hop.
	Subnets []netip.Prefix
}

// Bridge is a local bridge that containers attach to (m-<overlay>, d-<overlay>).
type Bridge struct {
	// Name of the bridge, at most 15 bytes.
	Name string
	// Gateway is the first host address of the bridge's sub-subnet with the
	// sub-subnet's prefix length (e.g. 10.128.1.1/25).
	Gateway netip.Prefix
	// Gateway6 optionally adds the IPv6 gateway (e.g. fd00:1::1/80).
	Gateway6 netip.Prefix
	// Extra are more gateways, IPv4 or IPv6, one in each block the bridge
	// grew beyond its first sub-subnet (e.g. 10.128.1.225/27).
	Extra []netip.Prefix
	// MTU of the bridge (the overlay MTU); 0 leaves it as it is.
	MTU int
}

// Desired is the whole dataplane state an agent wants in its namespace.
type Desired struct {
	VTEP    VTEP
	Peers   []Peer
	Bridges []Bridge
	// IPForward turns net.ipv4.ip_forward on in the dataplane's namespace.
	// false leaves the setting alone (something else may rely on it).
	IPForward bool
	// IPv6Forward turns IPv6 forwarding on for carve's own links (the VTEP
	// and the bridges), for IPv6 overlays; net.ipv6.conf.all is left alone
	// where the kernel allows (see ensureIPv6Forwarding). false leaves the
	// settings alone.
	IPv6Forward bool
	// Routed turns on the routed data path (routed.go): a peer on this
	// host's underlay segment gets plain routes via its underlay IP on the
	// underlay device, no encapsulation; the others stay on VXLAN. false
	// puts every peer on VXLAN. Never set it for an encrypted network: a
	// routed peer's traffic is in the clear.
	Routed bool
	// Segments are underlay prefixes an operator declared to be one L2
	// segment each (routed mode only): two hosts whose underlay IPs are
	// both inside one of them are routed even when the prefix of this
	// host's underlay address does not hold the peer's.
	Segments []netip.Prefix
}

// Kind names a class of kernel object in reports and errors; its values are
// meant to be used as a metric label.
type Kind string

// The kinds of object the dataplane manages.
const (
	KindVTEP      Kind = "vtep"
	KindNeighbour Kind = "neighbour"
	KindFDB       Kind = "fdb"
	KindRoute     Kind = "route"
	KindBridge    Kind = "bridge"
	KindAddress   Kind = "address"
	KindSysctl    Kind = "sysctl"
	KindPeer      Kind = "peer" // a peer rejected by validation
)

// Kinds lists every Kind, in a stable order (for metrics).
var Kinds = []Kind{KindVTEP, KindNeighbour, KindFDB, KindRoute, KindBridge, KindAddress, KindSysctl, KindPeer}

// Counts is what happened to the objects of one kind in one reconcile.
type Counts struct {
	Added   int // created because missing
	Updated int // existed but differed (or was not marked as carve's) and was fixed
	Removed int // carve's and no longer desired, deleted
	Failed  int // operations that failed (see Report.Errors)
}

// Changes is the number of kernel changes made.
func (c Counts) Changes() int { return c.Added + c.Updated + c.Removed }

// EntryError is the failure of one operation on one entry. A reconcile goes
// on after it; the entry is retried by the next Apply or Resync.
type EntryError struct {
	Kind Kind
	Key  string // e.g. "100.64.0.3", "70:b3:d5:40:00:03", "10.128.2.0/24"
	Peer string // the peer the entry belongs to, if any
	Op   string // "add", "replace", "delete", "validate", ...
	Err  error
}

// Error formats the failure as "op kind key (peer ID): cause".
func (e EntryError) Error() string {
	s := fmt.Sprintf("%s %s %s", e.Op, e.Kind, e.Key)
	if e.Peer != "" {
		s += " (peer " + e.Peer + ")"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the cause (often a unix.Errno from the kernel).
func (e EntryError) Unwrap() error { return e.Err }

// Report tells what a reconcile changed, per kind, and what failed.
type Report struct {
	// Full is true when the kernel was read back (Resync, the first Apply,
	// or an Apply that found the VTEP recreated).
	Full       bool
	VTEP       Counts
	Neighbours Counts
	FDB        Counts
	Routes     Counts
	Bridges    Counts
	Addresses  Counts
	Sysctls    Counts
	// Rejected counts peers (or parts of peers) refused by validation.
	Rejected int
	// Modes is how each peer with entries is reached (ModeVXLAN or
	// ModeRouted), by peer ID: what the reconcile programmed, or tried to.
	Modes map[string]Mode
	// FastPath is the state of the routed data path's eBPF shortcut
	// (FastPathOn, FastPathOff, or FastPathUnavailable and why); empty
	// when routed mode is off.
	FastPath string
	Errors   []EntryError
	Duration time.Duration
}

// ByKind returns the counts keyed by kind, for exporting as labelled metrics.
func (r *Report) ByKind() map[Kind]Counts {
	return map[Kind]Counts{
		KindVTEP: r.VTEP, KindNeighbour: r.Neighbours, KindFDB: r.FDB, KindRoute: r.Routes,
		KindBridge: r.Bridges, KindAddress: r.Addresses, KindSysctl: r.Sysctls,
		KindPeer: {Failed: r.Rejected},
	}
}

// Changes is the total number of kernel changes made.
func (r *Report) Changes() int {
	n := 0
	for _, c := range []Counts{r.VTEP, r.Neighbours, r.FDB, r.Routes, r.Bridges, r.Addresses, r.Sysctls} {
		n += c.Changes()
	}
	return n
}

// Err summarises Errors as one error (nil when there are none).
func (r *Report) Err() error {
	switch len(r.Errors) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("vxlan: %w", r.Errors[0])
	default:
		return fmt.Errorf("vxlan: %d operations failed, first: %w", len(r.Errors), r.Errors[0])
	}
}

func (r *Report) counts(k Kind) *Counts {
	switch k {
	case KindVTEP:
		return &r.VTEP
	case KindNeighbour:
		return &r.Neighbours
	case KindFDB:
		return &r.FDB
	case KindRoute:
		return &r.Routes
	case KindBridge:
		return &r.Bridges
	case KindAddress:
		return &r.Addresses
	case KindSysctl:
		return &r.Sysctls
	}
	return &Counts{}
}

// fail records a failed operation.
func (r *Report) fail(k Kind, key, peer, op string, err error) {
	if k == KindPeer {
		r.Rejected++
	} else {
		r.counts(k).Failed++
	}
	r.Errors = append(r.Errors, EntryError{Kind: k, Key: key, Peer: peer, Op: op, Err: err})
}

// LinkLocal returns the IPv6 link-local address (fe80::/64, modified EUI-64)
// that Linux gives an interface with this MAC. carve routes a peer's IPv6
// subnets via the link-local address of the peer's VTEP, which every agent can
// derive from the leased MAC without any extra lease.
func LinkLocal(mac net.HardwareAddr) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	if len(mac) != 6 {
		return netip.Addr{}
	}
	a[8] = mac[0] ^ 0x02
	a[9], a[10] = mac[1], mac[2]
	a[11], a[12] = 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(a)
}

// validMAC checks a unicast, non-zero 6-byte MAC.
func validMAC(m net.HardwareAddr) error {
	if len(m) != 6 {
		return fmt.Errorf("MAC %q is not 6 bytes", m.String())
	}
	if m[0]&1 != 0 {
		return fmt.Errorf("MAC %s is multicast", m)
	}
	if bytes.Equal(m, make([]byte, 6)) {
		return errors.New("MAC is all zero")
	}
	return nil
}

// validate checks the VTEP; a bad VTEP stops the reconcile since nothing can
// be programmed without it.
func (v *VTEP) validate() error {
	if err := api.ValidateIfName(v.Name); err != nil {
		return fmt.Errorf("vtep name: %w", err)
	}
	if v.VNI == 0 || v.VNI >= 1<<24 {
		return fmt.Errorf("vtep %s: VNI %d out of range 1-16777215", v.Name, v.VNI)
	}
	if v.Port == 0 {
		return fmt.Errorf("vtep %s: port must be set", v.Name)
	}
	if !v.Local.IsValid() || v.Local.IsUnspecified() || v.Local.Zone() != "" {
		return fmt.Errorf("vtep %s: invalid local underlay IP %v", v.Name, v.Local)
	}
	if err := validMAC(v.MAC); err != nil {
		return fmt.Errorf("vtep %s: %w", v.Name, err)
	}
	if v.MTU != 0 && (v.MTU < 68 || v.MTU > 65535) {
		return fmt.Errorf("vtep %s: MTU %d out of range", v.Name, v.MTU)
	}
	if !v.Address.IsValid() || !v.Address.Addr().Is4() {
		return fmt.Errorf("vtep %s: address %v must be an IPv4 address with prefix", v.Name, v.Address)
	}
	if v.Address6.IsValid() && (!v.Address6.Addr().Is6() || v.Address6.Addr().Is4In6() || v.Address6.Addr().Zone() != "") {
		return fmt.Errorf("vtep %s: address6 %v must be an IPv6 address with prefix", v.Name, v.Address6)
	}
	return nil
}

func (b *Bridge) validate() error {
	if err := api.ValidateIfName(b.Name); err != nil {
		return fmt.Errorf("bridge name: %w", err)
	}
	if b.Gateway.IsValid() && !b.Gateway.Addr().Is4() {
		return fmt.Errorf("bridge %s: gateway %s is not IPv4 (use Gateway6)", b.Name, b.Gateway)
	}
	if b.Gateway6.IsValid() && !b.Gateway6.Addr().Is6() {
		return fmt.Errorf("bridge %s: gateway6 %s is not IPv6", b.Name, b.Gateway6)
	}
	if b.MTU != 0 && (b.MTU < 68 || b.MTU > 65535) {
		return fmt.Errorf("bridge %s: MTU %d out of range", b.Name, b.MTU)
	}
	for _, p := range b.Extra {
		if !p.IsValid() || p.Addr().Zone() != "" {
			return fmt.Errorf("bridge %s: extra gateway %v", b.Name, p)
		}
	}
	return nil
}

// equal compares two bridge specs.
func (b Bridge) equal(o Bridge) bool {
	return b.Name == o.Name && b.Gateway == o.Gateway && b.Gateway6 == o.Gateway6 && b.MTU == o.MTU && slices.Equal(b.Extra, o.Extra)
}

// addresses returns the addresses the bridge should carry.
func (b *Bridge) addresses() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range append([]netip.Prefix{b.Gateway, b.Gateway6}, b.Extra...) {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}
