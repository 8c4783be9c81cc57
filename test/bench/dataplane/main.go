// Command dataplane benchmarks carve's data path against the bare underlay
// it runs on, in one run, on a lab of two hosts (labcluster: a master and two
// agents, real `carve` processes, TLS and signed records on, in network
// namespaces joined by a veth underlay):
//
//   - TCP throughput (iperf3, Debian's package), one stream and four;
//   - UDP packet rate for small (64-byte) datagrams (iperf3 -u, unlimited);
//   - round-trip latency (ICMP echo, median of many);
//
// container to container across the two hosts over the overlay (a namespace
// attached to each host's bridge through CNI, as a runtime does it) beside
// host to host over the underlay, on the same veth path, in the same lab.
// Every row is a ratio to the underlay, and the measurements of the two paths
// alternate round by round so that the drift of a shared machine hits both.
//
// Each overlay configuration (see variants: VXLAN, the routed data path,
// WireGuard) runs in a lab of its own and is judged against that lab's
// underlay; their rows share one table. It needs root and iperf3; everything
// happens inside namespaces it creates and removes (also on SIGINT/SIGTERM).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// prefix names the benchmark's namespaces.
const prefix = "carvebenchdp"

// overlay is the lab's overlay (netconfig.Default's).
const overlay = "carve"

// options are the command line's.
type options struct {
	seconds     int    // length of one iperf3 measurement
	rounds      int    // alternations of overlay and underlay per figure
	pings       int    // echoes per path and round
	underlayMTU int    // MTU of the lab's underlay
	tweaks      bool   // also measure the settings carve does not make
	binary      string // carve binary (built when empty)
	cniPath     string // carve-ipam and the reference plugins (built when empty)
	only        string // measure only the variants whose name holds it
}

func main() {
	var o options
	flag.IntVar(&o.seconds, "seconds", 3, "length of one iperf3 measurement, in seconds")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds per figure: each measures the overlay and the underlay in turn; the table shows medians")
	flag.IntVar(&o.pings, "pings", 100, "echoes per path and round for the round-trip latency")
	flag.IntVar(&o.underlayMTU, "underlay-mtu", 1500, "MTU of the lab's underlay veths and bridge")
	flag.BoolVar(&o.tweaks, "tweaks", true, "also measure, on the first overlay configuration, each data path setting carve does not make (GRO, bridge netfilter hooks) beside carve's")
	flag.StringVar(&o.binary, "carve", "", "carve binary (default: build ./cmd/carve of this module)")
	flag.StringVar(&o.only, "only", "", "measure only the overlay configurations whose name holds this text (e.g. routed)")
	flag.StringVar(&o.cniPath, "cni-path", "", "directory with carve-ipam and the reference plugins (default: build them)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/dataplane:", err)
		os.Exit(1)
	}
}

// variant is one overlay configuration, measured in a lab of its own
// against that lab's underlay.
type variant struct {
	// name labels the variant's rows ("plain overlay").
	name string
	// configure changes the lab's network configuration (nil: defaults).
	configure func(*api.NetworkConfig)
	// mode is how the agents must reach each other before the
	// measurements (api.AgentPeer.Mode; "" for WireGuard).
	mode string
	// agentArgs are appended to the agents' command lines.
	agentArgs []string
}

// variants are the overlay configurations the benchmark measures, each in
// a lab of its own and against that lab's underlay: the plain overlay
// (VXLAN), the routed data path (the two hosts share the lab's segment: no
// encapsulation) with its eBPF fast path and without it, and the encrypted one (WireGuard between hosts,
// userspace wireguard-go where the kernel has no module). Offload tweaks
// are measured on the plain overlay only: they are VXLAN's.
func variants() []variant {
	return []variant{
		{name: "plain overlay (VXLAN)", mode: api.DataplaneVXLAN},
		{name: "routed overlay", mode: api.DataplaneRouted, configure: func(c *api.NetworkConfig) { c.Dataplane = api.DataplaneRouted }},
		{name: "routed overlay, kernel forwarding (--fast-path=false)", mode: api.DataplaneRouted,
			configure: func(c *api.NetworkConfig) { c.Dataplane = api.DataplaneRouted }, agentArgs: []string{"--fast-path=false"}},
		{name: "encrypted overlay (WireGuard)", configure: func(c *api.NetworkConfig) { c.Encryption = api.EncryptionWireGuard }},
	}
}

func run(ctx context.Context, o options) error {
	if !netnslab.IsRoot() {
		return errors.New("needs root to create network namespaces")
	}
	if o.seconds < 1 || o.rounds < 1 || o.pings < 1 {
		return fmt.Errorf("-seconds %d -rounds %d -pings %d: want each >= 1", o.seconds, o.rounds, o.pings)
	}
	iperf, err := exec.LookPath("iperf3")
	if err != nil {
		return fmt.Errorf("iperf3 is missing: install Debian's iperf3 package (deploy/install-deps.sh does): %w", err)
	}
	br, err := labcluster.NewBenchRun(ctx, prefix, "dataplane", o.binary, o.cniPath, true)
	if err != nil {
		return err
	}
	defer br.Close()
	// One table for every variant's rows, each beside its own lab's
	// underlay; the tweaks' tables after it.
	paths := benchtable.Table{Title: "data path vs underlay: container -> container across 2 hosts vs host -> host on the same veth underlay, each overlay in a lab of its own"}
	var tables []benchtable.Table
	for i, v := range variants() {
		if !strings.Contains(v.name, o.only) {
			continue
		}
		ts, err := measureVariant(ctx, br, filepath.Join(br.Dir, fmt.Sprintf("lab%d", i)), iperf, v, o)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		paths.Rows = append(paths.Rows, ts[0].Rows...)
		tables = append(tables, ts[1:]...)
		o.tweaks = false // once is enough: they are about the data path, not the variant
	}
	for _, t := range append([]benchtable.Table{paths}, tables...) {
		if err := t.Print(os.Stdout); err != nil {
			return err
		}
	}
	return nil
}

// measureVariant starts a lab with v's network configuration, attaches a
// container on each of its two hosts, and measures both paths (and with
// o.tweaks, the tweaks).
func measureVariant(ctx context.Context, br *labcluster.BenchRun, dir, iperf string, v variant, o options) (_ []benchtable.Table, err error) {
	netCfg := netconfig.Default()
	if v.configure != nil {
		v.configure(&netCfg)
	}
	opts := labcluster.Options{Binary: br.Binary, Hosts: 2, Masters: 1, Prefix: prefix, LogLevel: "warn", AgentArgs: v.agentArgs,
		Network: &netCfg, CNIPath: []string{br.CNIPath}, Dir: dir, UnderlayMTU: o.underlayMTU}
	var tables []benchtable.Table
	err = labcluster.With(ctx, opts, os.Stderr, func(c *labcluster.Cluster) error {
		var ferr error
		tables, ferr = measureOn(ctx, c, iperf, v, o)
		return ferr
	})
	return tables, err
}

// measureOn is measureVariant on the cluster c, created but not started.
func measureOn(ctx context.Context, c *labcluster.Cluster, iperf string, v variant, o options) (_ []benchtable.Table, err error) {
	fmt.Fprintf(os.Stderr, "== %s: starting a master and two agents\n", v.name)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = c.Start(wctx)
	cancel()
	if err != nil {
		return nil, err
	}
	h1, h2 := c.Host(1), c.Host(2)
	if v.mode != "" {
		if err := waitMode(ctx, c, v.mode); err != nil {
			return nil, err
		}
	}
	var cts [2]*labcluster.Container
	for i, h := range []*labcluster.Host{h1, h2} {
		if cts[i], err = c.AddCNIContainer(ctx, h, overlay, labcluster.CNIOptions{}); err != nil {
			return nil, fmt.Errorf("attach a container on %s: %w", h.Name, err)
		}
	}
	underlay := path{name: "underlay", from: h1.NS.Namespace, to: h2.NS.Namespace, addr: h2.IP().Addr()}
	over := path{name: v.name, from: cts[0].NS.Namespace, to: cts[1].NS.Namespace, addr: cts[1].Addr.Addr()}
	m := &meter{iperf: iperf, seconds: o.seconds, pings: o.pings}
	for _, p := range []*path{&underlay, &over} {
		if err := m.startServer(ctx, p); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, p := range []*path{&underlay, &over} {
			p.stopServer()
		}
	}()
	figures, err := m.compare(ctx, &over, &underlay, o.rounds)
	if err != nil {
		return nil, err
	}
	mtus, err := linkMTUs(cts[0].NS.Namespace, h1.NS.Namespace, c.Network().VTEPName)
	if err != nil {
		return nil, err
	}
	t := benchtable.Table{Title: fmt.Sprintf("data path, %s vs underlay", v.name)}
	base := "host -> host, underlay, same run"
	note := fmt.Sprintf("median of %d rounds; %s", o.rounds, mtus)
	for _, f := range figures {
		n := note
		if v.mode == "" && f.unit == "Gbit/CPU-s" {
			// Userspace WireGuard encrypts in the agents' processes, whose
			// CPU this row does not count.
			n += "; iperf3's CPU only, not the agents' WireGuard"
		}
		t.Add(benchtable.Row{Name: f.name + ", " + v.name, Value: f.value, Unit: f.unit, Baseline: base, BaseVal: f.base,
			HigherIsBetter: f.higherIsBetter, Note: n})
	}
	if !o.tweaks || v.mode != api.DataplaneVXLAN {
		return []benchtable.Table{t}, nil
	}
	tt, err := m.measureTweaks(ctx, &over, labTweaks(h1, h2, cts[0], cts[1], c.Network().VTEPName), o.rounds, v.name)
	if err != nil {
		return nil, err
	}
	return []benchtable.Table{t, tt}, nil
}

// waitMode waits until both agents report the other in mode (their
// /overlay-agent/peers): the measurements must cross the path they name.
func waitMode(ctx context.Context, c *labcluster.Cluster, mode string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return retry.Until(wctx, 200*time.Millisecond, func() error {
		for _, h := range c.Hosts() {
			ps, err := c.AgentClient(h).Peers(wctx)
			if err != nil {
				return err
			}
			if len(ps.Peers) != 1 || ps.Peers[0].Mode != mode || !ps.Peers[0].Programmed {
				return fmt.Errorf("%s's peers %+v, want one %s", h.Name, ps.Peers, mode)
			}
		}
		return nil
	})
}
