// Package netconfig is the cluster's network configuration as the masters
// take it: its defaults, the strict decoding and the validation of an
// operator's file (every rule of docs/configuration.md, each error naming
// the field and the fix), the parsed, immutable form the lease table
// allocates from (Network), and the rules of a change to the committed
// configuration (Merge: what agents hold never moves under them).
//
// It is a package of its own, not a part of master/state, because its one
// input is api.NetworkConfig: it knows nothing of agents, leases, Raft or
// HTTP, and imports nothing of ours but api (cmd/carve/deps_test.go keeps
// it so). master/state consumes a *Network; carve master and carve config
// load and validate files with it without the lease table.
//
// This file is the package's whole exported surface; the rules are in
// parse.go (the state machine's), usable.go (an operator's file only) and
// merge.go (a change).
package netconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"slices"

	"github.com/carve-net/carve/api"
)

// Defaults of the network configuration (docs/configuration.md).
const (
	DefaultVTEPSubnet = "100.64.0.0/16"
	DefaultVTEPMACOUI = "70:B3:D5:00:00:00"
	DefaultVTEPName   = "vtep1024"
	DefaultVNI        = 1024
	DefaultVTEPPort   = 4789
)

// ErrInvalidConfig is wrapped by every network configuration error.
var ErrInvalidConfig = errors.New("invalid network config")

// Default returns the configuration used when a field is absent.
func Default() api.NetworkConfig {
	return api.NetworkConfig{
		VTEPSubnet: DefaultVTEPSubnet,
		VTEPMACOUI: DefaultVTEPMACOUI,
		VTEPName:   DefaultVTEPName,
		VNI:        DefaultVNI,
		VTEPPort:   DefaultVTEPPort,
		// vtep_mtu and overlay_mtu stay 0: every agent follows the
		// smallest underlay MTU the agents registered (agent.planMTUs).
		Overlays: []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24}},
	}
}

// Load reads, defaults and validates a network configuration file.
func Load(path string) (api.NetworkConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return api.NetworkConfig{}, fmt.Errorf("read network config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return api.NetworkConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes a configuration (unknown fields are errors), fills in
// defaults and validates it.
func Parse(data []byte) (api.NetworkConfig, error) {
	var cfg api.NetworkConfig
	if err := api.DecodeStrict(bytes.NewReader(data), &cfg); err != nil {
		return api.NetworkConfig{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg = WithDefaults(cfg)
	if err := Validate(cfg); err != nil {
		return api.NetworkConfig{}, err
	}
	return cfg, nil
}

// Validate checks a configuration an operator gives, with defaults for
// its absent fields, against every rule: New's, and those that refuse a
// configuration that parses but cannot work (no overlay, an agent prefix
// without a container address, an overlay MTU the VTEP cannot carry). The
// error wraps ErrInvalidConfig and names the field.
func Validate(cfg api.NetworkConfig) error {
	cfg = WithDefaults(cfg)
	if _, err := New(cfg); err != nil {
		return err
	}
	return checkUsable(cfg)
}

// WithDefaults fills the absent fields of cfg with Default's.
func WithDefaults(cfg api.NetworkConfig) api.NetworkConfig {
	d := Default()
	if cfg.VTEPSubnet == "" {
		cfg.VTEPSubnet = d.VTEPSubnet
	}
	if cfg.VTEPMACOUI == "" {
		cfg.VTEPMACOUI = d.VTEPMACOUI
	}
	if cfg.VTEPName == "" {
		cfg.VTEPName = d.VTEPName
	}
	if cfg.VNI == 0 {
		cfg.VNI = d.VNI
	}
	if cfg.VTEPPort == 0 {
		cfg.VTEPPort = d.VTEPPort
	}
	if cfg.Overlays == nil {
		cfg.Overlays = d.Overlays
	}
	return cfg
}

// New checks cfg (defaults already filled in) against the rules the lease
// table applies and returns its parsed form. It is the replicated state
// machine's check: it must accept whatever an earlier master committed, so
// it leaves out Validate's usability rules.
func New(cfg api.NetworkConfig) (*Network, error) { return parseNetwork(cfg) }

// Equal tells whether two configurations are the same (as JSON, so an
// absent and an explicit default "enabled" are alike).
func Equal(a, b api.NetworkConfig) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// CanonicalPrefix parses a CIDR and refuses a zone or host bits, which
// usually mean a typo (10.128.0.1/9 when 10.128.0.0/9 was meant); the
// error says what was probably meant. Every prefix of the configuration
// is read with it, and the masters read the prefixes of requests alike.
func CanonicalPrefix(s string) (netip.Prefix, error) { return parseCanonicalPrefix(s) }

// InUse is what agents hold under a committed configuration, which a
// change must not move (Merge).
type InUse struct {
	// VTEP: some agent holds a VTEP address (vtep_subnet stays).
	VTEP bool
	// VTEP6: some agent holds an IPv6 VTEP address (vtep_subnet6 stays).
	VTEP6 bool
	// Overlays names the overlays in which some agent holds a block, or
	// deleted agents' space is quarantined.
	Overlays map[string]bool
}

// Merge computes the configuration that applying cfg to the committed one
// (cur; nil when none is committed) gives: overlays the new file drops but
// that hold leases stay, disabled; a leased overlay's subnets and the VTEP
// subnets in use never change under the agents; a new overlay that would
// overlap a kept one is left out. The problems are returned as warnings,
// never as an abort; the error is New's on the result. Deterministic: the
// replicas of the lease table apply it.
func Merge(cur *Network, cfg api.NetworkConfig, use InUse) (*Network, []string, error) {
	return merge(cur, cfg, use)
}

// Network is a validated network configuration in parsed form. It is
// immutable: its getters hand out copies, so tables, snapshots and readers
// share one.
type Network struct {
	cfg      api.NetworkConfig
	vtepNet  netip.Prefix
	vtepNet6 netip.Prefix // invalid when vtep_subnet6 is not configured
	oui      [3]byte
	overlays []Overlay
}

// Config is the configuration n was parsed from (a copy).
func (n *Network) Config() api.NetworkConfig {
	c := n.cfg
	c.Segments = slices.Clone(c.Segments)
	c.Overlays = slices.Clone(c.Overlays)
	for i, o := range c.Overlays {
		if o.Enabled != nil {
			c.Overlays[i].Enabled = new(*o.Enabled)
		}
	}
	return c
}

// VTEPNet is the VTEP subnet (vtep_subnet).
func (n *Network) VTEPNet() netip.Prefix { return n.vtepNet }

// VTEPNet6 is the IPv6 VTEP subnet (vtep_subnet6); invalid when it is not
// configured.
func (n *Network) VTEPNet6() netip.Prefix { return n.vtepNet6 }

// OUI is the three high bytes of every VTEP MAC address (vtep_mac_oui).
func (n *Network) OUI() [3]byte { return n.oui }

// Overlays yields the overlays in configuration order.
func (n *Network) Overlays() iter.Seq[Overlay] { return slices.Values(n.overlays) }

// Overlay returns the overlay of that name, or false.
func (n *Network) Overlay(name string) (Overlay, bool) {
	for _, d := range n.overlays {
		if d.cfg.Name == name {
			return d, true
		}
	}
	return Overlay{}, false
}

// Overlay is one validated overlay of a Network (a value: immutable).
type Overlay struct {
	cfg     api.OverlayNetwork
	subnet  netip.Prefix // invalid when the overlay is IPv6 only
	prefix  int
	subnet6 netip.Prefix // invalid when the overlay is IPv4 only
	prefix6 int
	// growPrefix and growPrefix6 are the lengths of grown blocks.
	growPrefix, growPrefix6 int
	// quotaPrefix and quotaPrefix6 cap an agent's grown and granted space.
	quotaPrefix, quotaPrefix6 int
	enabled                   bool
}

// Config is the overlay as configured (a copy).
func (d Overlay) Config() api.OverlayNetwork {
	c := d.cfg
	if c.Enabled != nil {
		c.Enabled = new(*c.Enabled)
	}
	return c
}

// Name is the overlay's name.
func (d Overlay) Name() string { return d.cfg.Name }

// Enabled tells whether agents are leased space in the overlay; a disabled
// one keeps its leases, draining.
func (d Overlay) Enabled() bool { return d.enabled }

// Subnet is the overlay's IPv4 subnet; invalid when it is IPv6 only.
func (d Overlay) Subnet() netip.Prefix { return d.subnet }

// Prefix is the length of an agent's IPv4 subnet.
func (d Overlay) Prefix() int { return d.prefix }

// Subnet6 is the overlay's IPv6 subnet; invalid when it is IPv4 only.
func (d Overlay) Subnet6() netip.Prefix { return d.subnet6 }

// Prefix6 is the length of an agent's IPv6 subnet.
func (d Overlay) Prefix6() int { return d.prefix6 }

// GrowBits is the prefix length of the blocks an agent grows by in one
// family (grow_prefix, grow_prefix6).
func (d Overlay) GrowBits(is4 bool) int {
	if is4 {
		return d.growPrefix
	}
	return d.growPrefix6
}

// QuotaBits is the prefix length of an agent's quota of grown and granted
// space in one family (quota_prefix, quota_prefix6); 0 when the overlay
// has no subnet of that family.
func (d Overlay) QuotaBits(is4 bool) int {
	if is4 {
		return d.quotaPrefix
	}
	return d.quotaPrefix6
}
