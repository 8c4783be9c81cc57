// Command cni benchmarks container attachment through CNI on a real agent
// (labcluster: a master and an agent, real `carve` processes, in network
// namespaces), each figure beside a baseline measured in the same run:
//
//   - CNI ADD+DEL through the reference bridge plugin with carve-ipam (the
//     conflist the agent wrote; every allocation and release is a fsynced
//     bbolt transaction in the agent) beside the same bridge plugin with
//     host-local (a conflist written here: same plugins, same bridge MTU, a
//     bridge of its own in the same host namespace), sequentially and with
//     several runtimes in parallel, in rounds that alternate the two (each
//     goes first in every other round); the figure to judge is the median
//     of the rounds' ratios, printed with its quartiles and range;
//   - allocations and releases per second of the agent's IPAM through its
//     unix socket, from one client and from several at once (group commit
//     lets concurrent changes share one transaction), beside raw sequential
//     fsynced bbolt Update transactions per second on the same disk (the
//     agent's data dir's file system).
//
// libcni runs inside the host namespace, as in the tests, so the plugins and
// their veths live there. It needs root; everything happens inside
// namespaces it creates and removes (also on SIGINT/SIGTERM).
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
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// prefix names the benchmark's namespaces.
const prefix = "carvebenchcni"

// overlay is the lab's overlay; each agent gets a /22 of it, so the mesos
// bridge has 509 container addresses.
const overlay = "carve"

// hostLocalSubnet is the baseline's container range: private, outside the
// overlay, used only inside the host namespace.
const hostLocalSubnet = "172.30.0.0/22"

func main() {
	cycles := flag.Int("cycles", 600, "ADD+DEL cycles per CNI measurement, per side, spread over the rounds")
	rounds := flag.Int("rounds", 12, "rounds of each CNI measurement: carve and host-local alternate (each goes first in every other round), and the ratio reported is the median of the rounds' ratios")
	parallel := flag.Int("parallel", 8, "runtimes attaching at once in the parallel measurements")
	allocs := flag.Int("allocs", 400, "allocations (then releases) per IPAM measurement (at most 500)")
	binary := flag.String("carve", "", "carve binary (default: build ./cmd/carve of this module)")
	cniPath := flag.String("cni-path", "", "directory with carve-ipam and the reference plugins (default: build them)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *cycles, *rounds, *parallel, *allocs, *binary, *cniPath); err != nil {
		fmt.Fprintln(os.Stderr, "bench/cni:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cycles, rounds, parallel, allocs int, binary, cniPath string) (err error) {
	if !netnslab.IsRoot() {
		return errors.New("needs root to create network namespaces")
	}
	if rounds < 2 || cycles < rounds || parallel < 1 || allocs < parallel || allocs > 500 {
		return fmt.Errorf("-cycles %d -rounds %d -parallel %d -allocs %d: want rounds >= 2, cycles >= rounds, parallel >= 1 and parallel <= allocs <= 500", cycles, rounds, parallel, allocs)
	}
	br, err := labcluster.NewBenchRun(ctx, prefix, "cni", binary, cniPath, true)
	if err != nil {
		return err
	}
	defer br.Close()
	dir, binary, cniPath := br.Dir, br.Binary, br.CNIPath
	netCfg := netconfig.Default()
	netCfg.Overlays[0].Prefix = 22
	opts := labcluster.Options{Binary: binary, Hosts: 1, Masters: 1, Prefix: prefix, LogLevel: "warn",
		Network: &netCfg, CNIPath: []string{cniPath}, Dir: filepath.Join(dir, "lab")}
	return labcluster.With(ctx, opts, os.Stderr, func(c *labcluster.Cluster) error {
		return measure(ctx, c, dir, cniPath, cycles, rounds, parallel, allocs)
	})
}

// measure starts the cluster and prints both tables.
func measure(ctx context.Context, c *labcluster.Cluster, dir, cniPath string, cycles, rounds, parallel, allocs int) error {
	fmt.Fprintln(os.Stderr, "== starting a master and an agent")
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := c.Start(wctx)
	cancel()
	if err != nil {
		return err
	}
	h := c.Host(1)

	b, err := newBench(ctx, c, h, dir, cniPath, parallel)
	if err != nil {
		return err
	}
	cniTbl := benchtable.Table{Title: fmt.Sprintf("CNI ADD+DEL through the bridge plugin: carve-ipam (real agent) vs host-local, same host namespace, MTU %d", c.OverlayMTU())}
	for _, workers := range []int{1, parallel} {
		carve, local, ratios, err := b.rounds(ctx, workers, cycles, rounds)
		if err != nil {
			return err
		}
		what := "sequential"
		if workers > 1 {
			what = strconv.Itoa(workers) + " in parallel"
		}
		base := "bridge + host-local, same run"
		r := spreadOf(ratios)
		cniTbl.Add(benchtable.Row{Name: "ADD+DEL latency ratio, " + what, Value: r.median, Unit: "x", Baseline: "parity with host-local",
			BaseVal: 1, Note: fmt.Sprintf("median of %d per-round ratios of medians; quartiles %.3f-%.3f, range %.3f-%.3f", len(ratios), r.q1, r.q3, r.min, r.max)})
		cniTbl.Add(benchtable.Row{Name: "ADD+DEL latency, " + what, Value: ms(median(carve.cycle)), Unit: "ms", Baseline: base,
			BaseVal: ms(median(local.cycle)), Note: fmt.Sprintf("median of %d, all rounds", len(carve.cycle))})
		cniTbl.Add(benchtable.Row{Name: "ADD latency, " + what, Value: ms(median(carve.add)), Unit: "ms", Baseline: base,
			BaseVal: ms(median(local.add)), Note: "median"})
		cniTbl.Add(benchtable.Row{Name: "DEL latency, " + what, Value: ms(median(carve.del)), Unit: "ms", Baseline: base,
			BaseVal: ms(median(local.del)), Note: "median"})
		cniTbl.Add(benchtable.Row{Name: "ADD+DEL throughput, " + what, Value: carve.rate(), Unit: "cycles/s", Baseline: base,
			BaseVal: local.rate(), HigherIsBetter: true})
	}

	// The IPAM against raw sequential bbolt updates on the same disk: every
	// row's baseline is that one figure, the median of measurements taken
	// before, between and after the IPAM rows (a shared disk drifts), so
	// the rows with several clients show what group commit gains over one
	// fsync per change.
	ipamTbl := benchtable.Table{Title: "agent IPAM over its unix socket (group commit: concurrent changes share a bbolt transaction and fsync) vs raw sequential fsynced bbolt Update, same disk"}
	baselinePath := filepath.Join(h.AgentDataDir, "bench-baseline.db")
	var baselines []float64
	measureBaseline := func() error {
		v, err := boltUpdates(baselinePath, allocs)
		baselines = append(baselines, v)
		return err
	}
	type ipamRow struct {
		workers        int
		alloc, release float64
	}
	var rows []ipamRow
	for _, workers := range []int{1, parallel} {
		if err := measureBaseline(); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "== IPAM: %d allocations and releases, %d client(s) at once\n", allocs, workers)
		alloc, release, err := b.ipam(ctx, workers, allocs)
		if err != nil {
			return err
		}
		rows = append(rows, ipamRow{workers, alloc, release})
	}
	if err := measureBaseline(); err != nil {
		return err
	}
	slices.Sort(baselines)
	base := baselines[len(baselines)/2]
	var spread []string
	for _, v := range baselines {
		spread = append(spread, benchtable.Format(v))
	}
	for _, r := range rows {
		what := "1 client"
		if r.workers > 1 {
			what = strconv.Itoa(r.workers) + " clients"
		}
		note := fmt.Sprintf("%d allocations; baseline median of %s ops/s", allocs, strings.Join(spread, ", "))
		ipamTbl.Add(benchtable.Row{Name: "allocate, " + what, Value: r.alloc, Unit: "ops/s", Baseline: "raw sequential bbolt Update (fsync)",
			BaseVal: base, HigherIsBetter: true, Note: note})
		ipamTbl.Add(benchtable.Row{Name: "release, " + what, Value: r.release, Unit: "ops/s", Baseline: "raw sequential bbolt Update (fsync)",
			BaseVal: base, HigherIsBetter: true})
	}
	if err := cniTbl.Print(os.Stdout); err != nil {
		return err
	}
	return ipamTbl.Print(os.Stdout)
}

// bench holds the runtime side: a libcni runtime of its own (the same
// plugins, a cache dir in the lab) called from inside the host namespace,
// the two lists, and a container namespace per parallel runtime.
type bench struct {
	c          *labcluster.Cluster
	h          *labcluster.Host
	cni        *libcni.CNIConfig
	carveList  *libcni.NetworkConfigList
	localList  *libcni.NetworkConfigList
	containers []*netnslab.Namespace
	seq        int
}

func newBench(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, dir, cniPath string, parallel int) (*bench, error) {
	carveList, err := c.Conflist(h, overlay)
	if err != nil {
		return nil, err
	}
	// The baseline: carve's list with host-local in place of carve-ipam,
	// on a bridge of its own (the bridge plugin creates it, with the
	// gateway) with the same MTU.
	doc := fmt.Sprintf(`{"cniVersion": %q, "name": "host-local", "plugins": [
  {"type": "bridge", "bridge": "b-hostlocal", "isGateway": true, "ipMasq": false, "hairpinMode": true, "mtu": %d,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}`,
		carveList.CNIVersion, c.OverlayMTU(), hostLocalSubnet, filepath.Join(dir, "host-local"))
	localList, err := libcni.NetworkConfFromBytes([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("host-local list: %w", err)
	}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	b := &bench{c: c, h: h, carveList: carveList, localList: localList,
		cni: libcni.NewCNIConfigWithCacheDir([]string{cniPath}, filepath.Join(dir, "cni-cache"), exec)}
	for i := range parallel {
		n, err := c.Lab.AddNamespace("bc" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		b.containers = append(b.containers, n)
	}
	// Warm up both lists (the baseline's bridge is created by its first ADD).
	for _, list := range []*libcni.NetworkConfigList{carveList, localList} {
		if _, err := b.cycles(ctx, list, 1, 3); err != nil {
			return nil, fmt.Errorf("warm-up of %s: %w", list.Name, err)
		}
	}
	return b, nil
}

// rounds measures both lists in interleaved rounds of cycles/rounds
// ADD+DEL cycles each, carve first in even rounds and host-local first in
// odd ones, so that a machine's drift (other load, a disk flushing) hits
// both alike, and returns every cycle of each side and each round's ratio
// of the median cycle times (carve / host-local).
func (b *bench) rounds(ctx context.Context, workers, cycles, rounds int) (carve, local measurement, ratios []float64, err error) {
	per := cycles / rounds
	for round := range rounds {
		sides := []struct {
			list *libcni.NetworkConfigList
			acc  *measurement
			got  measurement
		}{{list: b.carveList, acc: &carve}, {list: b.localList, acc: &local}}
		if round%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for i := range sides {
			sd := &sides[i]
			fmt.Fprintf(os.Stderr, "== %s: %d ADD+DEL cycles, %d at once (round %d of %d)\n", sd.list.Name, per, workers, round+1, rounds)
			if sd.got, err = b.cycles(ctx, sd.list, workers, per); err != nil {
				return carve, local, nil, fmt.Errorf("%s: %w", sd.list.Name, err)
			}
			sd.acc.merge(sd.got)
		}
		c, l := sides[0].got, sides[1].got
		if sides[0].list != b.carveList {
			c, l = l, c
		}
		ratios = append(ratios, float64(median(c.cycle))/float64(median(l.cycle)))
	}
	return carve, local, ratios, nil
}

// spread is a sample's median, quartiles and range.
type spread struct{ min, q1, median, q3, max float64 }

func spreadOf(vs []float64) spread {
	s := slices.Clone(vs)
	slices.Sort(s)
	at := func(q float64) float64 { // linear interpolation between ranks
		pos := q * float64(len(s)-1)
		i := int(pos)
		if i+1 >= len(s) {
			return s[i]
		}
		return s[i] + (pos-float64(i))*(s[i+1]-s[i])
	}
	return spread{min: s[0], q1: at(0.25), median: at(0.5), q3: at(0.75), max: s[len(s)-1]}
}

// measurement is what a series of ADD+DEL cycles took.
type measurement struct {
	add, del, cycle []time.Duration
	n               int
	wall            time.Duration
}

func (m *measurement) merge(o measurement) {
	m.add = append(m.add, o.add...)
	m.del = append(m.del, o.del...)
	m.cycle = append(m.cycle, o.cycle...)
	m.n += o.n
	m.wall += o.wall
}

// rate is cycles per second of wall time.
func (m *measurement) rate() float64 { return float64(m.n) / m.wall.Seconds() }

// cycles runs n ADD+DEL cycles of list, spread over workers runtimes, each
// attaching its own container namespace again and again with a new
// container id.
func (b *bench) cycles(ctx context.Context, list *libcni.NetworkConfigList, workers, n int) (measurement, error) {
	var mu sync.Mutex
	var out measurement
	var errs []error
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range next {
				mu.Lock()
				b.seq++
				rt := &libcni.RuntimeConf{ContainerID: "bench-" + strconv.Itoa(b.seq), IfName: "eth0", NetNS: b.containers[w].Path}
				mu.Unlock()
				octx, cancel := context.WithTimeout(ctx, 30*time.Second)
				t0 := time.Now()
				err := b.h.NS.Do(func() error {
					_, err := b.cni.AddNetworkList(octx, list, rt)
					return err
				})
				t1 := time.Now()
				if err == nil {
					err = b.h.NS.Do(func() error { return b.cni.DelNetworkList(octx, list, rt) })
				}
				t2 := time.Now()
				cancel()
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", rt.ContainerID, err))
				} else {
					out.add = append(out.add, t1.Sub(t0))
					out.del = append(out.del, t2.Sub(t1))
					out.cycle = append(out.cycle, t2.Sub(t0))
					out.n++
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	out.wall = time.Since(start)
	return out, errors.Join(errs...)
}

// ipam allocates n attachments over the agent's socket from workers clients
// at once, then releases them, and returns allocations and releases per second.
func (b *bench) ipam(ctx context.Context, workers, n int) (alloc, release float64, err error) {
	cl := api.NewIPAMClient(b.h.SocketPath(), 30*time.Second)
	run := func(op func(i int) error) (float64, error) {
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					if err := op(i); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds(), errors.Join(errs...)
	}
	req := func(i int) api.IPAMRequest {
		return api.IPAMRequest{Network: overlay, ContainerID: fmt.Sprintf("ipam-bench-%d-%d", workers, i), IfName: "eth0"}
	}
	if alloc, err = run(func(i int) error { _, err := cl.Allocate(ctx, req(i)); return err }); err != nil {
		return 0, 0, fmt.Errorf("allocate: %w", err)
	}
	if release, err = run(func(i int) error { _, err := cl.Release(ctx, req(i)); return err }); err != nil {
		return 0, 0, fmt.Errorf("release: %w", err)
	}
	return alloc, release, nil
}

// boltUpdates is the baseline: n sequential bbolt Update transactions (one
// small put each, fsynced like the agent's), per second, in a fresh file at
// path.
func boltUpdates(path string, n int) (float64, error) {
	_ = os.Remove(path)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return 0, err
	}
	defer os.Remove(path)
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		return 0, err
	}
	val := []byte(`{"bridge":"mesos","v4":"10.128.0.2"}`)
	start := time.Now()
	for i := range n {
		key := []byte("carve\x00baseline-" + strconv.Itoa(i) + "\x00eth0")
		if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Put(key, val) }); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
