// Package kernel is what an agent asks of its host's kernel for a set of
// verified records, and the asking: the desired VXLAN dataplane (its VTEP,
// its bridges, an entry set for every peer, the routed path, the blocks
// growth added), the MTUs agreed from the underlay MTUs in the records, the
// disabled overlays a drain leaves out, and the accept rules in the host's
// FORWARD chain; applied through package vxlan and package firewall, with
// the metrics of each reconcile, and what the last one achieved.
//
// It knows nothing of the agent and checks nothing: the agent hands it its
// own record, the network configuration and the membership it verified
// (package membership), and reads back a Result. What is not VXLAN's is
// the agent's: the peers it reaches through WireGuard are taken out of the
// desired state by Input.Divert, and the CNI configurations, the IPAM and
// the reports to the masters are the agent's own.
//
// The exported surface is this file; desired.go computes the desired
// dataplane, mtu.go the MTUs, drain.go the drained overlays, forward.go
// keeps the FORWARD accept rules, result.go reads a reconcile's report and
// metrics.go counts the reconciles.
package kernel

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/firewall"
	"github.com/carve-net/carve/internal/ratelog"
	"github.com/carve-net/carve/vxlan"
)

// DefaultOverlayMTU and DefaultVTEPMTU are the MTUs programmed while
// neither the network configuration nor any underlay MTU says (see
// WithMTUs).
const (
	DefaultOverlayMTU = 1420
	DefaultVTEPMTU    = 1450
)

// Options are what a Kernel drives and for whom. The caller opens the
// dataplane and the firewall, and closes them after the Kernel's last use.
type Options struct {
	// Dataplane programs the kernel (required).
	Dataplane *vxlan.Dataplane
	// Firewall keeps the FORWARD accept rules (nil: none are kept).
	Firewall *firewall.Forward
	// ID is the agent's id, and Local its underlay IP (its VTEP's source).
	ID    string
	Local netip.Addr
	// Logger logs what changed (nil: slog.Default); Registerer takes the
	// metrics (nil: none are registered).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Kernel programs one host's kernel from an agent's verified records.
// Drain, Reconcile and RemoveForwardRules belong to one caller at a time
// (the agent's reconcile loop, then its Run once the loop has ended); the
// other methods are safe for concurrent use.
type Kernel struct {
	dp      *vxlan.Dataplane
	fw      *firewall.Forward
	id      string
	local   netip.Addr
	log     *slog.Logger
	metrics *metrics
	mtu     mtuState
	// fwState and drainLogged are the reconcile loop's own: what it knows
	// of the FORWARD accept rules (forward.go), and, per disabled overlay,
	// "draining" or "drained" as last logged (drain.go).
	fwState     forwardState
	drainLogged map[string]string
	last        atomic.Pointer[Result]
}

// New returns a Kernel that programs through opts.Dataplane.
func New(opts Options) *Kernel {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	k := &Kernel{dp: opts.Dataplane, fw: opts.Firewall, id: opts.ID, local: opts.Local, log: opts.Logger,
		metrics: newMetrics(opts.Registerer, opts.Dataplane), drainLogged: map[string]string{}}
	k.fwState.errLog = ratelog.New(time.Minute)
	k.last.Store(&Result{})
	return k
}

// Growth is what routing needs of the IPAM's grown blocks.
type Growth interface {
	// BridgeGateways are a bridge's gateways in the blocks it grew.
	BridgeGateways(network, bridge string) []netip.Prefix
	// PeerBlocks are the blocks the rings give other agents beyond the
	// subnets known to be routed to them.
	PeerBlocks(known map[string][]netip.Prefix) map[string][]netip.Prefix
}

// Leased tells whether the masters leased an overlay of the agent's
// record to it: it is in the record with a subnet. The kernel, and the
// conflists, follow that, never the overlay's state.status, which is what
// the agent reported itself.
func Leased(ov *api.AgentOverlay) bool { return ov.Subnet != "" || ov.Subnet6 != "" }

// Drain is self as the kernel is to hold it, and the overlays it left out:
// the disabled overlays with no container attached on this host any more
// (attached counts a network's attachments here), whose bridges, routes and
// conflists go. It logs, once per change, which disabled overlays this
// host still serves containers on and which it drained.
func (k *Kernel) Drain(self *api.AgentInfo, network *api.NetworkConfig, attached func(network string) int) (*api.AgentInfo, map[string]bool) {
	drained := drainedOverlays(self, network, attached)
	k.noteDrained(self, network, drained, attached)
	return withoutOverlays(self, drained), drained
}

// WithMTUs returns a copy of network whose vtep_mtu and overlay_mtu are the
// ones to program, from the configuration, this agent's underlay MTU
// (RefreshUnderlayMTU) and those in the records held (logging the agreed
// MTUs and any conflict when they change), so that the VTEP, the bridges,
// the conflists and the IPAM all read them from one place.
func (k *Kernel) WithMTUs(network *api.NetworkConfig, records []membership.PeerRecord) *api.NetworkConfig {
	k.mtu.mu.Lock()
	own := k.mtu.own
	k.mtu.mu.Unlock()
	p := planMTUs(network, k.local, k.id, own, records)
	var out api.NetworkConfig
	if network != nil {
		out = *network
	}
	out.VTEPMTU, out.OverlayMTU = p.VTEP, p.Overlay
	k.mtu.mu.Lock()
	defer k.mtu.mu.Unlock()
	k.mtu.overlay = p.Overlay
	if s := fmt.Sprint(p.VTEP, p.Overlay, p.Underlay, p.From); s != k.mtu.logged {
		k.mtu.logged = s
		k.log.Info("MTUs", "vtep", p.VTEP, "overlay", p.Overlay, "smallest_underlay", p.Underlay, "of_agent", p.From)
	}
	if s := fmt.Sprint(p.Conflicts); s != k.mtu.warned {
		k.mtu.warned = s
		for _, c := range p.Conflicts {
			k.log.Warn("network configuration: " + c)
		}
	}
	return &out
}

// RefreshUnderlayMTU reads the MTU of the agent's underlay device, the one
// it registers, and remembers it for WithMTUs (0 when it cannot be read:
// the MTUs then follow the other agents' records).
func (k *Kernel) RefreshUnderlayMTU() int {
	mtu, link, err := k.dp.UnderlayMTU(k.local)
	switch {
	case err != nil:
		k.log.Warn("cannot read the underlay MTU; the MTUs follow the other agents' records", "ip", k.local, "err", err)
		mtu = 0
	case api.ValidateUnderlayMTU(mtu) != nil:
		k.log.Warn("underlay MTU out of range: not registered", "link", link, "mtu", mtu)
		mtu = 0
	}
	k.mtu.mu.Lock()
	k.mtu.own = mtu
	k.mtu.mu.Unlock()
	return mtu
}

// OverlayMTU is the overlay MTU WithMTUs last computed (0: none yet).
func (k *Kernel) OverlayMTU() int {
	k.mtu.mu.Lock()
	defer k.mtu.mu.Unlock()
	return k.mtu.overlay
}

// RemoveForwardRules takes the FORWARD accept rules out when the agent
// stops, after the last Reconcile, if this run kept them (a run that never
// reconciled leaves the firewall alone).
func (k *Kernel) RemoveForwardRules() {
	if k.fw == nil || !k.fwState.touched {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.fw.Remove(ctx); err != nil {
		k.log.Error("remove the FORWARD accept rules", "err", err)
	}
}

// Input is what one reconcile programs.
type Input struct {
	// Self is the agent's own record as the kernel is to hold it (Drain's),
	// Network the configuration with the MTUs to program (WithMTUs), and
	// Members the records the agent verified.
	Self    *api.AgentInfo
	Network *api.NetworkConfig
	Members membership.State
	// Drained are the overlays Drain took out of Self: no route goes to
	// the peers' subnets of them either.
	Drained map[string]bool
	// Index is the masters' state index the membership holds, reported
	// with the result (Result.Index).
	Index uint64
	// Growth adds the grown and granted blocks (nil: none).
	Growth Growth
	// Full reads the kernel back and repairs it whole (a resync), rather
	// than applying the difference from the last reconcile.
	Full bool
	// Divert, when set, takes out of the desired state the peers reached
	// another way (through WireGuard) before the kernel is asked, and
	// names the device they go through ("": none), which the FORWARD
	// accept rules then cover.
	Divert func(want *vxlan.Desired) (device string)
}

// Reconcile brings the kernel to the state in describes (the difference,
// or a full resync) and keeps the FORWARD accept rules; the Result it returns
// is also Last's. Its error is the dataplane's (which logs what it
// changed), or why the desired state cannot be computed: then Result.Report
// is nil and nothing reached the kernel.
func (k *Kernel) Reconcile(ctx context.Context, in Input) (*Result, error) {
	want, peers, err := desiredState(in.Self, in.Network, k.local, in.Members, in.Drained)
	if err != nil {
		prev := k.Last()
		res := &Result{Version: prev.Version, Index: prev.Index, programmed: prev.programmed, Err: err}
		k.last.Store(res)
		return res, err
	}
	if in.Growth != nil {
		addGrowth(&want, in.Self, in.Growth)
	}
	device := ""
	if in.Divert != nil {
		device = in.Divert(&want)
	}
	var rep vxlan.Report
	mode := "apply"
	if in.Full {
		mode = "resync"
		rep, err = k.dp.Resync(ctx, want)
	} else {
		rep, err = k.dp.Apply(ctx, want)
	}
	k.metrics.observe(mode, &rep)
	k.keepForwardRules(ctx, &want, device, in.Network, in.Full) // after the bridges exist
	res := &Result{Version: in.Self.Version, Index: in.Index, Report: &rep, Err: err, programmed: programmed(&rep, peers)}
	k.metrics.programmed(len(res.programmed), len(peers))
	k.last.Store(res)
	return res, err
}

// Last is what the last reconcile achieved (a zero Result before the first).
func (k *Kernel) Last() *Result { return k.last.Load() }

// Result is what a reconcile achieved; it never changes once returned.
type Result struct {
	// Version is the version of the agent's record the last reconcile
	// that reached the kernel was for (0: none yet), and Index the
	// masters' state index its membership held.
	Version, Index uint64
	// Report is the dataplane's report (nil: the desired state could not
	// be computed), Err the reconcile's error.
	Report *vxlan.Report
	Err    error
	// programmed are the peers the kernel holds, by id, at the version
	// programmed: those of the last reconcile that reached the kernel,
	// but for the ones whose entries failed.
	programmed map[string]uint64
}

// Programmed is the version of a peer's record the kernel holds.
func (r *Result) Programmed(id string) (uint64, bool) {
	v, ok := r.programmed[id]
	return v, ok
}

// ProgrammedCount is how many peers the kernel holds.
func (r *Result) ProgrammedCount() int { return len(r.programmed) }

// Mode is how the kernel reaches a peer (vxlan.Modes): empty for the peers
// it did not program, those reached through WireGuard among them.
func (r *Result) Mode(id string) string {
	if r.Report == nil {
		return ""
	}
	return string(r.Report.Modes[id])
}

// FastPath is the state of the routed peers' eBPF fast path
// (vxlan.Report.FastPath): empty when routed mode is off.
func (r *Result) FastPath() string {
	if r.Report == nil {
		return ""
	}
	return r.Report.FastPath
}

// OverlayError names the failure of the reconcile that concerns an
// overlay of the agent's record: its VTEP, its bridges or their addresses
// ("" none). Failures of single peer entries are the peers' (Programmed).
func (r *Result) OverlayError(ov *api.AgentOverlay) string {
	if r.Err == nil {
		return ""
	}
	if r.Report == nil { // the desired state itself could not be computed
		return r.Err.Error()
	}
	var names []string
	for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
		if br != nil {
			names = append(names, br.Name)
		}
	}
	for _, e := range r.Report.Errors {
		switch e.Kind {
		case vxlan.KindVTEP, vxlan.KindSysctl:
			return e.Error()
		case vxlan.KindBridge:
			// By exact name: the bridges of "dcos" are not those of "dcos6".
			if e.Key == "*" || slices.Contains(names, e.Key) {
				return e.Error()
			}
		case vxlan.KindAddress:
			if addressOf(ov, e.Key) {
				return e.Error()
			}
		}
	}
	return ""
}
