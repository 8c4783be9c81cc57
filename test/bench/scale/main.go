// Command scale benchmarks carve at scale: 3 real masters (secure: TLS and
// signed records) with N synthetic agents registered over HTTP, and one
// real agent in a network namespace (test/lab/labcluster). Every figure is
// printed beside the full-state baseline measured in the same run: bytes a
// watcher receives for one change (changes vs whole state), registration to
// programmed in the real agent, state reads with 50 concurrent readers,
// master and agent RSS, agent restart to serving, gossip bytes per change
// and per anti-entropy round (membership, rings and mesh's topology,
// encoded in process as the agent and mesh encode them, beside the
// whole-state gossip), and the real
// agent's idle CPU seconds per minute beside the same measurement of a
// carve built from git revision -baseline-rev (the tree before the delta
// watch and gossip changes) running the same cluster with the same N.
//
// Attributed claims are on, as users run carve: the synthetic agents
// register claim keys, and after they are programmed a mesh peer hands the
// real agent, once, every synthetic agent's signed ring claims (claims.go),
// which it verifies and holds through the idle window and the
// registrations. The idle CPU and registration to programmed are printed
// beside a carve built from -baseline-rev (default: the tree before
// attributed claims and record format 3), run on the same cluster and N
// (its synthetic agents register no keys, and it is handed no claims: it
// reads none), and a signed ring change beside the same change unsigned.
//
// -only fanout measures the fan-out of the changes watch instead
// (fanout.go): W watchers (one connection each) over the three masters,
// one registration, a burst of 100 and a leader killed, each timed until
// every watcher holds it, with the masters' RSS, beside the carve of
// -fanout-baseline-rev run in the same invocation.
//
// N is 1,000 and 5,000 by default; SCALE=1 adds 10,000 (long). Progress
// goes to stderr, the tables to stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

const prefix = "carve-bench-scale-"

func main() {
	sizes := flag.String("agents", "1000,5000", "synthetic agent counts, comma separated (SCALE=1 adds 10000)")
	readers := flag.Int("readers", 50, "concurrent state readers")
	binary := flag.String("carve", "", "carve binary (default: build ./cmd/carve of this module)")
	var o idleOptions
	flag.DurationVar(&o.window, "idle", 30*time.Second, "window over which the idle agent's CPU is read")
	flag.DurationVar(&o.settle, "idle-settle", 15*time.Second, "wait after the agent programmed every peer before the idle window")
	flag.StringVar(&o.rev, "baseline-rev", "21633db", "git revision whose carve is the idle-CPU and registration baseline (built from git archive; 21633db: before attributed claims, 946600f: before the changes watch and gossip deltas)")
	flag.StringVar(&o.binary, "baseline-carve", "", "carve binary for the idle-CPU baseline instead of building -baseline-rev (\"none\": skip it)")
	flag.StringVar(&o.profileDir, "profile-dir", "", "save a CPU profile of the real agent over the idle window to DIR/agent-idle-N.pprof (the agent runs with --debug-addr)")
	flag.BoolVar(&o.noClaims, "no-signed-claims", false, "hand the real agent no signed claims of the synthetic agents")
	flag.BoolVar(&o.mesh, "synthetic-mesh", false, "give the synthetic agents mesh addresses (nothing listens there: the real agent dials absent peers)")
	flag.StringVar(&o.only, "only", "", "\"state\": measure only the state reads (after registering and programming; no idle CPU, restart or baseline), to iterate on them; \"gossip\": only the gossip bytes rows (in process, no cluster)")
	flag.IntVar(&o.watchers, "watchers", 0, "-only fanout: watchers of the changes (default: the agent count)")
	flag.IntVar(&o.perProcess, "watchers-per-process", 15000, "-only fanout: watchers one process holds; more run in watcher processes of this many (one process holds at most 20,000 descriptors here)")
	flag.BoolVar(&o.longPolls, "fanout-long-polls", true, "-only fanout: measure the long polls before the streams")
	flag.DurationVar(&o.restartAfter, "fanout-restart", 0, "-only fanout: start the killed leader again this long after the kill, as systemd's RestartSec=5s does (0: never); needed where two masters cannot hold every watcher")
	watchChild := flag.Bool("watch-child", false, "internal: run as a watcher process of -only fanout (its spec on stdin)")
	flag.StringVar(&o.fanoutRev, "fanout-baseline-rev", "65163cf", "git revision whose carve is the fan-out baseline (65163cf: before the shared changes answers)")
	flag.StringVar(&o.masterArgs, "master-args", "", "-only fanout: extra flags for the masters, space separated (e.g. \"--max-connections 32768\")")
	flag.IntVar(&o.stateRounds, "state-rounds", 1, "rounds of the concurrent state reads; the rows pool every round's latencies, each round's p50/p99 goes to stderr")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *watchChild {
		if err := runWatchChild(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "bench/scale:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, *sizes, *readers, *binary, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/scale:", err)
		os.Exit(1)
	}
}

// idleOptions configure the idle CPU rows.
type idleOptions struct {
	window, settle time.Duration
	rev            string        // baseline revision, built unless binary is set
	binary         string        // baseline binary; "none" skips the baseline
	mesh           bool          // synthetic agents have mesh addresses
	noClaims       bool          // the real agent is handed no signed claims
	profileDir     string        // where the idle agent's CPU profile goes ("": none)
	lab            string        // carve-lab binary (the claims feeder)
	only           string        // "state": only the state-read rows
	stateRounds    int           // rounds of the concurrent state reads
	watchers       int           // -only fanout: watchers (0: the agent count)
	perProcess     int           // -only fanout: watchers one process holds
	longPolls      bool          // -only fanout: measure the long polls too
	restartAfter   time.Duration // -only fanout: restart the killed leader after this
	fanoutRev      string        // the fan-out baseline's revision
	masterArgs     string        // -only fanout: extra master flags
}

// progress prints a progress line on stderr.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "== "+format+"\n", args...)
}

func run(ctx context.Context, sizesFlag string, readers int, binary string, o idleOptions) error {
	if !netnslab.IsRoot() {
		return errors.New("needs root to create network namespaces")
	}
	var sizes []int
	for _, s := range strings.Split(sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 60000 {
			return fmt.Errorf("-agents %q: want counts of 1-60000", sizesFlag)
		}
		sizes = append(sizes, n)
	}
	switch o.only {
	case "":
	case "state":
		o.binary = "none"
	case "gossip":
		return gossipOnly(ctx, sizes)
	case "fanout":
		return fanoutOnly(ctx, sizes, binary, o)
	default:
		return fmt.Errorf("-only %q: want \"state\", \"gossip\", \"fanout\" or nothing", o.only)
	}
	if o.stateRounds < 1 {
		return fmt.Errorf("-state-rounds %d: want at least 1", o.stateRounds)
	}
	if os.Getenv("SCALE") == "1" && !slices.Contains(sizes, 10000) {
		sizes = append(sizes, 10000)
	}
	if binary == "" {
		progress("building carve")
	}
	br, err := labcluster.NewBenchRun(ctx, prefix, "scale", binary, "", false)
	if err != nil {
		return err
	}
	defer br.Close()
	dir, binary := br.Dir, br.Binary
	if !o.noClaims && o.only == "" {
		progress("building carve-lab (the claims feeder)")
		if o.lab, err = labcluster.BuildLab(ctx, dir); err != nil {
			return err
		}
	}
	// The baseline binary; baseNA says why there is none.
	baseline, baseNA := o.binary, ""
	switch baseline {
	case "none":
		baseline, baseNA = "", "n/a (skipped: -baseline-carve none)"
	case "":
		progress("building the baseline carve of %s", o.rev)
		if baseline, err = buildBaseline(ctx, o.rev, dir); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			baseNA = "n/a (baseline not built)"
			if errors.Is(err, errNoHistory) {
				baseNA = "n/a (no git history)"
			}
			fmt.Fprintf(os.Stderr, "bench/scale: the idle-CPU baseline: %v\n", err)
		}
	}
	for _, n := range sizes {
		tbl, err := measure(ctx, binary, n, readers, o)
		if err != nil {
			return fmt.Errorf("%d agents: %w", n, err)
		}
		switch {
		case o.only != "":
			// no baseline rows
		case baseline != "":
			var base baselineFigures
			base, err = baselineRun(ctx, baseline, n, o)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench/scale: %d agents, the baseline: %v\n", n, err)
			}
			for _, r := range baselineRows(&tbl) {
				switch {
				case err != nil:
					r.Baseline, r.BaseNA = "n/a (the baseline run failed; see stderr)", true
				case strings.HasPrefix(r.Name, idleRow):
					r.BaseVal = base.idle
				default:
					r.BaseVal = ms(base.register)
				}
			}
		default:
			for _, r := range baselineRows(&tbl) {
				r.Baseline, r.BaseNA = baseNA, true
			}
		}
		if err := tbl.Print(os.Stdout); err != nil {
			return err
		}
	}
	return nil
}

// gossipOnly prints the gossip bytes rows alone, for each size.
func gossipOnly(ctx context.Context, sizes []int) error {
	for _, n := range sizes {
		tbl := benchtable.Table{Title: fmt.Sprintf("scale: gossip bytes at %d agents (real handlers on the fake network, in process)", n)}
		rows, err := gossipBytesRows(ctx, n)
		if err != nil {
			return fmt.Errorf("%d agents: %w", n, err)
		}
		topo, err := topologyBytesRows(n)
		if err != nil {
			return fmt.Errorf("%d agents: %w", n, err)
		}
		for _, r := range append(rows, topo...) {
			tbl.Add(r)
		}
		if err := tbl.Print(os.Stdout); err != nil {
			return err
		}
	}
	return nil
}

// networkFor is the masters' network for n agents: the default's overlay
// (10.128.0.0/9, a /24 each) holds 32,768 agents, so beyond that the
// overlay is 10.0.0.0/8 (65,536), as an operator would size it; nil: the
// default.
func networkFor(n int) *api.NetworkConfig {
	if n <= 32000 {
		return nil
	}
	cfg := netconfig.Default()
	cfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.0.0.0/8", Prefix: 24}}
	return &cfg
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// synthetic is the registration of synthetic agent i, with its claim key
// when keys (a baseline from before record format 3 reads none). Without
// mesh (the
// default) it has no mesh address: the real agent must not dial thousands
// of absent peers. With mesh it has one (nothing listens there), so that
// the agent's mesh side (its connections and dials) is part of the
// figures.
func synthetic(i int, mesh, keys bool) api.RegisterRequest {
	ip := fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)
	req := api.RegisterRequest{AgentID: fmt.Sprintf("%s%06d", syntheticPrefix, i), IP: ip,
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}
	if keys {
		req.Keys = claimKeys(i)
	}
	if mesh {
		req.MeshAddr = ip + ":6783"
	}
	return req
}

// measure runs the cluster at n agents and returns its table; the idle CPU
// row comes last, its baseline for the caller to fill in.
func measure(ctx context.Context, binary string, n, readers int, o idleOptions) (tbl benchtable.Table, err error) {
	progress("%d agents: starting the cluster", n)
	err = labcluster.With(ctx, labcluster.Options{Binary: binary, LabBinary: o.lab, Hosts: 3, Masters: 3, Prefix: prefix, LogLevel: "warn", Network: networkFor(n)}, os.Stderr, func(c *labcluster.Cluster) error {
		var ferr error
		tbl, ferr = measureOn(ctx, c, n, readers, o)
		return ferr
	})
	tbl.Title = fmt.Sprintf("scale: %d synthetic agents, 3 secure masters, one real agent (real processes, network namespaces)", n)
	return tbl, err
}

// measureOn is measure on the cluster c, created but not started.
func measureOn(ctx context.Context, c *labcluster.Cluster, n, readers int, o idleOptions) (tbl benchtable.Table, err error) {
	if err := c.StartMasters(ctx); err != nil {
		return tbl, err
	}
	h := c.Host(1)
	start := time.Now()
	if err := c.StartAgent(h, profileArgs(o, h)...); err != nil {
		return tbl, err
	}
	if _, err := c.WaitAgent(ctx, h); err != nil {
		return tbl, err
	}
	emptyStart := time.Since(start)

	op := c.Client()
	progress("%d agents: registering", n)
	if err := registerAll(ctx, op, n, o.mesh, true); err != nil {
		return tbl, err
	}
	progress("%d agents: waiting for the real agent to program them", n)
	if err := waitProgrammed(ctx, c, h, n); err != nil {
		return tbl, err
	}
	claimsNote := "handed no signed claims (-no-signed-claims)"
	if !o.noClaims && o.only == "" {
		progress("%d agents: handing the real agent their signed claims", n)
		writers, size, cpu, err := feedClaims(ctx, c, h)
		if err != nil {
			return tbl, err
		}
		claimsNote = fmt.Sprintf("holding %d agents' signed claims (a %d KB ring message, verified and merged in %.2f CPU s)", writers, size>>10, cpu)
	}
	if o.only == "state" {
		progress("%d agents: state reads", n)
		return tbl, stateRows(ctx, c, &tbl, readers, o.stateRounds)
	}
	// Idle CPU first, so that it is read at the same time after the
	// agent programmed its peers as the baseline's.
	progress("%d agents: idle CPU (%s settle, %s window)", n, o.settle, o.window)
	profiled := startProfile(ctx, c, h, n, o)
	idle, err := idleCPU(ctx, h.Agent.PID(), o.settle, o.window)
	if err := errors.Join(err, profiled()); err != nil {
		return tbl, err
	}
	progress("%d agents: bytes per change, registration to programmed, state reads, restart", n)

	// Bytes to one watcher for one change.
	delta, full, fullGz, err := bytesPerChange(ctx, c, op, n, o.mesh)
	if err != nil {
		return tbl, err
	}
	tbl.Add(benchtable.Row{Name: "bytes to a watcher for one registration (changes watch)", Value: float64(delta), Unit: "B",
		Baseline: "the whole state (blocking state watch)", BaseVal: float64(full), Note: fmt.Sprintf("goal < 2 KB; the state gzip'ed: %d B", fullGz)})

	// Registration to programmed in the real agent.
	lat, commit, err := registerToProgrammedMedian(ctx, c, op, h, n, o.mesh, true)
	if err != nil {
		return tbl, err
	}
	tbl.Add(benchtable.Row{Name: "registration -> programmed in the real agent", Value: ms(lat), Unit: "ms",
		Baseline: "Register round trip (commit)", BaseVal: ms(commit), Note: "median of 3; /overlay-agent/peers polled every 20ms; goal < 1 s"})
	tbl.Add(benchtable.Row{Name: registerRow, Value: ms(lat), Unit: "ms",
		Baseline: "carve " + o.rev + ", same cluster and N", Note: claimsNote + "; goal < 1 s"})

	// State reads, 50 concurrent readers.
	if err := stateRows(ctx, c, &tbl, readers, o.stateRounds); err != nil {
		return tbl, err
	}

	// Memory.
	var masterRSS float64
	for _, m := range c.Masters() {
		masterRSS = max(masterRSS, rssMB(m.PID()))
	}
	fullMB := float64(full) / (1 << 20)
	tbl.Add(benchtable.Row{Name: "master RSS (largest of 3)", Value: masterRSS, Unit: "MB", Baseline: "the encoded state", BaseVal: fullMB})
	tbl.Add(benchtable.Row{Name: "real agent RSS", Value: rssMB(h.Agent.PID()), Unit: "MB", Baseline: "the encoded state", BaseVal: fullMB})
	if st, err := os.Stat(filepath.Join(h.AgentDataDir, "agent.db")); err == nil {
		tbl.Add(benchtable.Row{Name: "real agent's agent.db (bbolt) size", Value: float64(st.Size()) / (1 << 20), Unit: "MB", Baseline: "the encoded state", BaseVal: fullMB,
			Note: "membership, leases, rings and allocations, after every registration"})
	}

	// Agent restart to serving.
	if err := c.StopAgent(ctx, h); err != nil {
		return tbl, err
	}
	start = time.Now()
	if err := c.StartAgent(h); err != nil {
		return tbl, err
	}
	if _, err := c.WaitAgent(ctx, h); err != nil {
		return tbl, err
	}
	restart := time.Since(start)
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("agent restart -> serving, %d peers", n), Value: ms(restart), Unit: "ms",
		Baseline: "first start, no peers", BaseVal: ms(emptyStart), Note: "overlays STATUS_OK on /overlay-agent/overlay; goal < 2 s at 5,000"})

	rows, err := gossipBytesRows(ctx, n)
	if err != nil {
		return tbl, err
	}
	topo, err := topologyBytesRows(n)
	if err != nil {
		return tbl, err
	}
	for _, r := range append(rows, topo...) {
		tbl.Add(r)
	}
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("%s, %d peers", idleRow, n), Value: idle, Unit: "CPU s/min",
		Baseline: "carve " + o.rev + ", same cluster and N", BaseVal: 0,
		Note: fmt.Sprintf("/proc utime+stime over %s, %s after all peers programmed; %s; %s; goal < 0.6 (1%% of a core)", o.window, o.settle, claimsNote, meshNote(o.mesh))})
	return tbl, nil
}

// Names of the rows measured again with the baseline binary.
const (
	idleRow     = "idle agent CPU"
	registerRow = "registration -> programmed, beside the baseline carve"
)

// baselineRows are the rows of tbl whose baseline is the baseline binary's
// figure.
func baselineRows(tbl *benchtable.Table) []*benchtable.Row {
	var out []*benchtable.Row
	for i := range tbl.Rows {
		if r := &tbl.Rows[i]; strings.HasPrefix(r.Name, idleRow) || r.Name == registerRow {
			out = append(out, r)
		}
	}
	return out
}

// registerToProgrammedMedian registers three more synthetic agents after
// the n first, one at a time, and returns the medians of registration to
// programmed in the real agent and of the Register round trip.
func registerToProgrammedMedian(ctx context.Context, c *labcluster.Cluster, op *apiclient.Client, h *labcluster.Host, n int, mesh, keys bool) (time.Duration, time.Duration, error) {
	var lat, commit []time.Duration
	for k := range 3 {
		l, cm, err := registerToProgrammed(ctx, c, op, h, synthetic(n+1+k, mesh, keys))
		if err != nil {
			return 0, 0, err
		}
		lat, commit = append(lat, l), append(commit, cm)
	}
	return median(lat), median(commit), nil
}

// waitProgrammed waits (at most 5 minutes) until the agent on h reports n
// programmed peers.
func waitProgrammed(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, n int) error {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := retry.Until(wctx, 500*time.Millisecond, func() error {
		p, err := c.AgentClient(h).Peers(wctx)
		if err != nil {
			return err
		}
		programmed := 0
		for _, peer := range p.Peers {
			if peer.Programmed {
				programmed++
			}
		}
		if programmed < n {
			return fmt.Errorf("%d of %d programmed", programmed, n)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("the agent programs the synthetic agents: %w", err)
	}
	return nil
}

// registerAll registers n synthetic agents with 64 concurrent clients
// (with their claim keys when keys).
func registerAll(ctx context.Context, op *apiclient.Client, n int, mesh, keys bool) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if _, err := op.Register(ctx, synthetic(i, mesh, keys)); err != nil {
					errs <- fmt.Errorf("register %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// registerToProgrammed registers req and times it until the real agent
// reports it programmed; it also returns the Register round trip.
func registerToProgrammed(ctx context.Context, c *labcluster.Cluster, op *apiclient.Client, h *labcluster.Host, req api.RegisterRequest) (time.Duration, time.Duration, error) {
	start := time.Now()
	if _, err := op.Register(ctx, req); err != nil {
		return 0, 0, err
	}
	commit := time.Since(start)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cl := c.AgentClient(h)
	for {
		p, err := cl.Peers(wctx)
		if err == nil && slices.ContainsFunc(p.Peers, func(p api.AgentPeer) bool { return p.AgentID == req.AgentID && p.Programmed }) {
			return time.Since(start), commit, nil
		}
		if !retry.Sleep(wctx, 20*time.Millisecond) {
			return 0, 0, fmt.Errorf("the real agent never programmed %s: %w", req.AgentID, wctx.Err())
		}
	}
}

// rssMB is a process's resident set size in MiB (0 when unreadable).
func rssMB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func median(ds []time.Duration) time.Duration { return pct(ds, 50) }

// meshNote says whether the synthetic peers have mesh addresses.
func meshNote(mesh bool) string {
	if mesh {
		return "peers with mesh addresses nothing listens on (-synthetic-mesh)"
	}
	return "peers without mesh address (no gossip peers; -synthetic-mesh adds them)"
}
