// Package firewall keeps the agent's accept rules in the host's FORWARD
// chain: whatever that chain's policy (dockerd sets it to DROP), packets
// forwarded between carve's own devices (its bridges, its VTEP, its
// WireGuard device) are accepted, so containers stay reachable from other
// hosts; with the routed data path, also packets between those devices and
// the underlay device to the overlays' prefixes (Rules.Underlay). The
// rules live in carve's own chains (Chain, jumped to from the
// first rule of FORWARD, and OutChain), in the iptables backend the host
// uses (nft or legacy: the one holding rules of others, as kube-proxy's
// and Docker's tools choose, else nft), for IPv4 and, when asked, IPv6.
// Ensure checks them and puts back what is missing (a flush, a dockerd
// restart that inserted its own jump above carve's); Remove takes them out.
//
// It runs the iptables binaries (the -save and -restore of each backend),
// inside the namespace of Options.NetNS when set: every change is one
// iptables-restore, applied whole or not at all.
package firewall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
)

// The chains carve owns in the filter table of each backend and family.
const (
	// Chain is jumped to from the first rule of FORWARD: a packet that came
	// in on one of carve's devices goes on to OutChain.
	Chain = "CARVE-FORWARD"
	// OutChain accepts a packet that goes out on one of carve's devices.
	OutChain = "CARVE-FORWARD-OUT"
)

// ErrNoIptables marks a host without the iptables binaries of a family:
// forwarding then depends on the FORWARD policy alone.
var ErrNoIptables = errors.New("no iptables binaries")

// ErrBadDevice marks a device name that cannot go into a rule.
var ErrBadDevice = errors.New("bad device name")

// Family is an IP family: iptables or ip6tables.
type Family string

// The families.
const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// Backend is an iptables backend: the kernel's nf_tables or the legacy
// x_tables.
type Backend string

// The backends.
const (
	NFT    Backend = "nft"
	Legacy Backend = "legacy"
)

// Rules is what Ensure keeps: forwarding accepted between Devices, in IPv4
// and, with IPv6, in IPv6 too.
type Rules struct {
	Devices []string
	IPv6    bool
	// Underlay is the underlay device of a routed data path ("": none):
	// forwarding is accepted between it and Devices for packets to the
	// prefixes in Routed only (the overlays' subnets), so that routed
	// peers' containers reach each other through a FORWARD policy of DROP
	// without the underlay being opened to anything else.
	Underlay string
	Routed   []netip.Prefix
}

// Options configure New.
type Options struct {
	// NetNS is the network namespace whose firewall is kept (tests); zero
	// means the process's own.
	NetNS netns.NsHandle
	// Logger receives what was installed or repaired (default slog.Default).
	Logger *slog.Logger
	// Registerer takes the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// LookPath finds an iptables binary by name (default: PATH, then
	// /usr/sbin and /sbin, where Debian puts them).
	LookPath func(name string) (string, error)
}

// Forward keeps the FORWARD accept rules of one namespace. Its methods are
// safe for concurrent use.
type Forward struct {
	log      *slog.Logger
	netns    ns.NetNS
	lookPath func(string) (string, error)
	installs *prometheus.CounterVec
	errs     *prometheus.CounterVec

	mu sync.Mutex
	// written is, per family and backend, the rules last written there:
	// finding them gone again is a repair.
	written map[toolKey][]string
	// kept is, per family, the backends the rules were last kept in, as
	// logged.
	kept map[Family]string
}

type toolKey struct {
	family  Family
	backend Backend
}

// New prepares the rules of the namespace; nothing changes before Ensure.
func New(opts Options) (*Forward, error) {
	f := &Forward{log: opts.Logger, lookPath: opts.LookPath, written: map[toolKey][]string{}, kept: map[Family]string{}}
	if f.log == nil {
		f.log = slog.Default()
	}
	if f.lookPath == nil {
		f.lookPath = lookPath
	}
	if opts.NetNS > 0 {
		var err error
		if f.netns, err = ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", int(opts.NetNS))); err != nil {
			return nil, fmt.Errorf("firewall: open the namespace: %w", err)
		}
	}
	f.installs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_forward_rules_installs_total",
		Help: "Times the agent wrote its FORWARD accept rules, by family, backend and reason: install (first time, or its devices changed), repair (they were gone or moved from the top of FORWARD: a flush, a dockerd restart).",
	}, []string{"family", "backend", "reason"})
	f.errs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_forward_rules_errors_total",
		Help: "Failed checks or writes of the FORWARD accept rules, by family (retried at the next reconcile).",
	}, []string{"family"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(f.installs); err != nil {
			return nil, fmt.Errorf("firewall: metrics: %w", err)
		}
		if err := opts.Registerer.Register(f.errs); err != nil {
			return nil, fmt.Errorf("firewall: metrics: %w", err)
		}
	}
	return f, nil
}

// Close releases the namespace handle; the rules stay (see Remove).
func (f *Forward) Close() error {
	if f.netns != nil {
		return f.netns.Close()
	}
	return nil
}

// Ensure makes the rules accept forwarding between r.Devices in the
// backends the host uses, and takes carve's chains out of the backends it
// no longer uses. It reads each backend once (iptables-save) and writes
// only where something differs. With no device it removes the rules.
func (f *Forward) Ensure(ctx context.Context, r Rules) error {
	want, err := familyRules(r, IPv4)
	if err != nil {
		return err
	}
	if len(want) == 0 {
		return f.Remove(ctx)
	}
	want6, err := familyRules(r, IPv6)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	families := []Family{IPv4}
	if r.IPv6 {
		families = append(families, IPv6)
	}
	var errs []error
	for _, fam := range families {
		rules := want
		if fam == IPv6 {
			rules = want6
		}
		if err := f.ensureFamily(ctx, fam, rules); err != nil {
			f.errs.WithLabelValues(string(fam)).Inc()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ensureFamily keeps the rules of one family.
func (f *Forward) ensureFamily(ctx context.Context, fam Family, want []string) error {
	tools, err := f.tools(ctx, fam)
	if err != nil {
		return err
	}
	states := make([]filterState, len(tools))
	var errs, readErrs []error
	for i, t := range tools {
		out, err := f.run(ctx, "", t.save)
		if err != nil {
			// A backend that cannot be read (a kernel without x_tables)
			// holds nobody's rules: the other one does the work.
			readErrs = append(readErrs, fmt.Errorf("firewall: read the %s rules (%s): %w", fam, t.backend, err))
			f.log.Debug("iptables backend unreadable", "family", fam, "backend", t.backend, "err", err)
			tools[i].broken = true
			continue
		}
		states[i] = parseSave(out)
	}
	if len(readErrs) == len(tools) {
		return errors.Join(readErrs...)
	}
	keep := chooseBackends(tools, states)
	var kept []string
	for i, t := range tools {
		if t.broken {
			continue
		}
		key := toolKey{fam, t.backend}
		st := states[i]
		if !keep[i] {
			if st.ours() {
				if err := f.restore(ctx, t, removeScript(st)); err != nil {
					errs = append(errs, fmt.Errorf("firewall: remove carve's %s rules from %s (the host no longer uses it): %w", fam, t.backend, err))
					continue
				}
				f.log.Info("FORWARD accept rules removed from a backend the host no longer uses", "family", fam, "backend", t.backend)
			}
			delete(f.written, key)
			continue
		}
		kept = append(kept, string(t.backend))
		if st.inSync(want) {
			f.written[key] = want
			continue
		}
		if err := f.restore(ctx, t, ensureScript(st, want)); err != nil {
			errs = append(errs, fmt.Errorf("firewall: write the %s FORWARD accept rules (%s): %w", fam, t.backend, err))
			continue
		}
		reason := "install"
		if slices.Equal(f.written[key], want) {
			reason = "repair"
			f.log.Warn("FORWARD accept rules were missing or not first in FORWARD (flushed, or another program inserted rules above them): reinstalled",
				"family", fam, "backend", t.backend, "forward_policy", st.policy, "found", st.describe())
		} else {
			f.log.Info("FORWARD accept rules installed", "family", fam, "backend", t.backend, "forward_policy", st.policy, "devices", devicesOf(want))
		}
		f.installs.WithLabelValues(string(fam), string(t.backend), reason).Inc()
		f.written[key] = want
	}
	if s := strings.Join(kept, ","); s != "" && s != f.kept[fam] {
		f.kept[fam] = s
		f.log.Info("FORWARD accept rules kept in the backend the host uses", "family", fam, "backends", s)
	}
	return errors.Join(errs...)
}

// Remove takes carve's jump and chains out of every backend of both
// families. A family without iptables has nothing to remove.
func (f *Forward) Remove(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		tools, err := f.tools(ctx, fam)
		if errors.Is(err, ErrNoIptables) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var readErrs []error
		for _, t := range tools {
			out, err := f.run(ctx, "", t.save)
			if err != nil {
				readErrs = append(readErrs, fmt.Errorf("firewall: read the %s rules (%s): %w", fam, t.backend, err))
				continue
			}
			st := parseSave(out)
			if !st.ours() {
				continue
			}
			if err := f.restore(ctx, t, removeScript(st)); err != nil {
				errs = append(errs, fmt.Errorf("firewall: remove carve's %s rules (%s): %w", fam, t.backend, err))
				continue
			}
			f.log.Info("FORWARD accept rules removed", "family", fam, "backend", t.backend)
		}
		// A backend that cannot be read holds nothing to remove (as in
		// Ensure), and a kernel without IPv6 no IPv6 rules; none of IPv4
		// readable is an error.
		if fam == IPv4 && len(readErrs) == len(tools) {
			errs = append(errs, readErrs...)
		}
		for k := range f.written {
			if k.family == fam {
				delete(f.written, k)
			}
		}
		delete(f.kept, fam)
	}
	return errors.Join(errs...)
}

// restore applies script with the backend's iptables-restore, leaving
// every chain it does not name as it is.
func (f *Forward) restore(ctx context.Context, t tool, script string) error {
	_, err := f.run(ctx, script, t.restore, "-w", "--noflush")
	return err
}

// inNS runs fn on an OS thread inside the namespace (directly for the
// process's own): a child forked there runs in it.
func (f *Forward) inNS(fn func() error) error {
	if f.netns == nil {
		return fn()
	}
	return f.netns.Do(func(ns.NetNS) error { return fn() })
}

// chooseBackends says which tools keep the rules: each backend holding
// rules or a policy of others (a packet crosses the hooks of both, and a
// DROP in either drops it), else nft (the default of current
// distributions), else the one there is.
func chooseBackends(tools []tool, states []filterState) []bool {
	keep := make([]bool, len(tools))
	used := false
	for i, t := range tools {
		if !t.broken && states[i].foreign > 0 {
			keep[i], used = true, true
		}
	}
	if used {
		return keep
	}
	for i, t := range tools {
		if !t.broken && t.backend == NFT {
			keep[i] = true
			return keep
		}
	}
	for i, t := range tools {
		if !t.broken {
			keep[i] = true
			return keep
		}
	}
	return keep
}
