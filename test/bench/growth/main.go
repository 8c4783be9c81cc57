// Command growth benchmarks the latency of a CNI ADD that makes its bridge
// grow, beside an ADD that needs no growth, measured in the same run on the
// same bridge (labcluster: a master and two agents, real `carve` processes,
// in network namespaces; ADDs through the reference bridge plugin and
// carve-ipam, as a runtime does them):
//
//   - lease path: overlay "lease" has room at the masters; an ADD that finds
//     its bridge full waits while the agent grows a block from the masters
//     (a Raft-committed lease, then the bridge's gateway in it);
//   - ring path: overlay "ring" is fully leased (one slice per agent), so
//     the masters are exhausted and an ADD that finds its bridge full waits
//     while the agent is granted a block by its peer through the ring.
//
// The agents run with --grow-low-water=-1, so that every growth happens on
// the path of the ADD that finds its bridge full (by default a bridge grows
// in the background before its last address is gone, and ADDs rarely wait).
// An ADD is counted as one that grew when its address is in a block that no
// earlier ADD's address was in. It needs root; everything happens inside
// namespaces it creates and removes (also on SIGINT/SIGTERM).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// prefix names the benchmark's namespaces.
const prefix = "carvebenchgrow"

const (
	leaseOverlay = "lease"
	ringOverlay  = "ring"
)

func main() {
	leaseAdds := flag.Int("lease-adds", 130, "ADDs on the lease overlay (a block holds 13 containers: every 13th grows)")
	ringAdds := flag.Int("ring-adds", 300, "at most this many ADDs on the ring overlay (they stop when the overlay is full)")
	binary := flag.String("carve", "", "carve binary (default: build ./cmd/carve of this module)")
	cniPath := flag.String("cni-path", "", "directory with carve-ipam and the reference plugins (default: build them)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *leaseAdds, *ringAdds, *binary, *cniPath); err != nil {
		fmt.Fprintln(os.Stderr, "bench/growth:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, leaseAdds, ringAdds int, binary, cniPath string) (err error) {
	if !netnslab.IsRoot() {
		return errors.New("needs root to create network namespaces")
	}
	if leaseAdds < 27 || ringAdds < 1 {
		return fmt.Errorf("-lease-adds %d -ring-adds %d: want at least 27 and 1", leaseAdds, ringAdds)
	}
	br, err := labcluster.NewBenchRun(ctx, prefix, "growth", binary, cniPath, true)
	if err != nil {
		return err
	}
	defer br.Close()
	dir, binary, cniPath := br.Dir, br.Binary, br.CNIPath
	netCfg := netconfig.Default()
	netCfg.Overlays = []api.OverlayNetwork{
		// /27 per agent: a /28 first block (13 containers), /28 grown blocks.
		{Name: leaseOverlay, Subnet: "10.128.0.0/20", Prefix: 27},
		// Two /24 slices for two agents: nothing left at the masters; the
		// donor grants up to half of its /25's free addresses at a time.
		{Name: ringOverlay, Subnet: "10.129.0.0/23", Prefix: 24},
	}
	opts := labcluster.Options{Binary: binary, Hosts: 2, Masters: 1, Prefix: prefix, LogLevel: "warn",
		Network: &netCfg, CNIPath: []string{cniPath}, Dir: filepath.Join(dir, "lab"),
		AgentArgs: []string{"--grow-low-water=-1", "--block-idle-return=-1s"}}
	return labcluster.With(ctx, opts, os.Stderr, func(c *labcluster.Cluster) error {
		return measure(ctx, c, leaseAdds, ringAdds)
	})
}

// measure starts the cluster and prints the table.
func measure(ctx context.Context, c *labcluster.Cluster, leaseAdds, ringAdds int) error {
	fmt.Fprintln(os.Stderr, "== starting a master and two agents")
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := c.Start(wctx)
	cancel()
	if err != nil {
		return err
	}
	h := c.Host(2)

	tbl := benchtable.Table{Title: "CNI ADD (bridge plugin + carve-ipam, real agent) that grows its bridge vs an ADD that needs no growth, same bridge, same run (--grow-low-water=-1: growth on the ADD's path)"}
	for _, side := range []struct {
		overlay, name, origin string
		adds                  int
	}{
		{leaseOverlay, "ADD that grows a block from the masters (lease path)", api.BlockGrown, leaseAdds},
		{ringOverlay, "ADD that is granted a block through the ring (masters exhausted)", api.BlockGranted, ringAdds},
	} {
		fmt.Fprintf(os.Stderr, "== %s: up to %d ADDs on %s\n", side.overlay, side.adds, h.Name)
		grew, plain, full, err := adds(ctx, c, h, side.overlay, side.origin, side.adds)
		if err != nil {
			return fmt.Errorf("%s: %w", side.overlay, err)
		}
		if len(grew) == 0 {
			return fmt.Errorf("%s: %d ADDs and none grew a %q block", side.overlay, len(plain), side.origin)
		}
		note := fmt.Sprintf("median of %d (max %.1f ms); baseline median of %d", len(grew), ms(slices.Max(grew)), len(plain))
		if full != nil {
			note += "; then the overlay was full"
		}
		tbl.Add(benchtable.Row{Name: side.name, Value: ms(median(grew)), Unit: "ms", Baseline: "ADD that needs no growth",
			BaseVal: ms(median(plain)), Note: note})
	}
	return tbl.Print(os.Stdout)
}

// adds attaches up to n containers to overlay on h, one at a time, and
// returns the ADD latencies of those whose address is in a new block of
// origin, of those in a block already used, and the error that ended the
// series early when the overlay was full (nil otherwise).
func adds(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, overlay, origin string, n int) (grew, plain []time.Duration, full, err error) {
	ipam := c.IPAMClient(h)
	used := map[string]bool{}
	for i := range n {
		ct, err := c.NewContainer(h, overlay, labcluster.CNIOptions{})
		if err != nil {
			return nil, nil, nil, err
		}
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		t0 := time.Now()
		err = c.CNIAdd(actx, ct)
		d := time.Since(t0)
		cancel()
		if err != nil {
			if i > 0 && overlay == ringOverlay {
				return grew, plain, err, nil // the donor keeps half: the overlay fills up
			}
			return nil, nil, nil, err
		}
		st, err := ipam.Status(ctx, overlay)
		if err != nil {
			return nil, nil, nil, err
		}
		b := blockOf(st, ct.Addr.Addr())
		if b == nil {
			return nil, nil, nil, fmt.Errorf("%s: no block of the agent holds it", ct)
		}
		switch {
		case used[b.Prefix]:
			plain = append(plain, d)
		case b.Origin == origin:
			grew = append(grew, d)
		case b.Origin == api.BlockLeased:
			plain = append(plain, d) // the first ADD of the run
		default:
			return nil, nil, nil, fmt.Errorf("%s in block %s of origin %q, want %q", ct, b.Prefix, b.Origin, origin)
		}
		used[b.Prefix] = true
	}
	return grew, plain, nil, nil
}

// blockOf is the mesos bridge's block of st that holds addr, or nil.
func blockOf(st *api.IPAMStatus, addr netip.Addr) *api.IPAMBlockUsage {
	for i, b := range st.Blocks[api.BridgeMesos] {
		if p, err := netip.ParsePrefix(b.Prefix); err == nil && p.Contains(addr) {
			return &st.Blocks[api.BridgeMesos][i]
		}
	}
	return nil
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
