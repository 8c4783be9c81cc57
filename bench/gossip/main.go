// Command gossip benchmarks the agents' gossip at scale.
//
// Bytes (in process, deterministic): the membership and ring gossip an
// agent sends for one change and for one round of periodic anti-entropy,
// at 1,000 and 5,000 agents, beside the whole-state gossip (what every
// periodic round carried before deltas and digests) measured in the same
// run from the same memberships. The messages are encoded exactly as the
// agent encodes them (agent.AntiEntropyRound).
//
// Idle CPU (needs root): one real agent process (labcluster, its own
// network namespace, TLS and signed records) fed N synthetic agents
// registered over HTTP with the masters; once it has programmed them all,
// its CPU seconds per minute of idleness, read from /proc. The baseline is
// the same measurement of another carve binary (-baseline-carve, e.g. one
// built from the tree before this change); without it the baseline column
// stays empty. It also times the agent's restart at N peers until it
// serves its overlay again.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/benchtable"
	"github.com/carve-net/carve/internal/labcluster"
	"github.com/carve-net/carve/internal/netnslab"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/ring"
)

// prefix names the benchmark's namespaces.
const prefix = "carvegossip"

func main() {
	sizes := flag.String("peers", "1000,5000", "membership sizes of the bytes table, comma separated")
	cpuSizes := flag.String("cpu-peers", "1000,5000", "peers of the idle-CPU measurement, comma separated (empty: skip it)")
	idle := flag.Duration("idle", time.Minute, "idle window the CPU is measured over")
	binary := flag.String("carve", "", "carve binary (default: build ./cmd/carve of this module)")
	baseline := flag.String("baseline-carve", "", "carve binary measured as the idle-CPU baseline (e.g. built from the tree before deltas and bounded connections)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *sizes, *cpuSizes, *idle, *binary, *baseline); err != nil {
		fmt.Fprintln(os.Stderr, "bench/gossip:", err)
		os.Exit(1)
	}
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 20000 {
			return nil, fmt.Errorf("size %q: want 1-20000", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, sizesFlag, cpuFlag string, idle time.Duration, binary, baseline string) error {
	sizes, err := parseSizes(sizesFlag)
	if err != nil {
		return fmt.Errorf("-peers: %w", err)
	}
	cpuSizes, err := parseSizes(cpuFlag)
	if err != nil {
		return fmt.Errorf("-cpu-peers: %w", err)
	}
	tbl := benchtable.Table{Title: "gossip: bytes an agent sends (encoded as the agent encodes them; baseline: the whole state, as periodic gossip sent it)"}
	for _, n := range sizes {
		if err := bytesRows(&tbl, n); err != nil {
			return err
		}
	}
	if err := tbl.Print(os.Stdout); err != nil {
		return err
	}
	if len(cpuSizes) == 0 {
		return nil
	}
	if !netnslab.IsRoot() {
		fmt.Println("idle CPU: skipped (needs root to create network namespaces)")
		return nil
	}
	if killed, removed, err := labcluster.RemoveStale(prefix); err != nil || len(killed)+len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "removed leftovers of a killed run: %d processes, %d namespaces (%v)\n", len(killed), len(removed), err)
	}
	if binary == "" {
		dir, err := os.MkdirTemp("", "carve-bench-gossip-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if binary, err = labcluster.BuildCarve(ctx, dir); err != nil {
			return err
		}
	}
	cpu := benchtable.Table{Title: fmt.Sprintf("gossip: an idle agent with N peers (real process, synthetic agents registered over HTTP; CPU over %s idle)", idle)}
	for _, n := range cpuSizes {
		cur, err := measureIdle(ctx, binary, n, idle)
		if err != nil {
			return fmt.Errorf("%d peers: %w", n, err)
		}
		base := idleResult{}
		baseName := "none measured (give -baseline-carve)"
		if baseline != "" {
			if base, err = measureIdle(ctx, baseline, n, idle); err != nil {
				return fmt.Errorf("%d peers, baseline: %w", n, err)
			}
			baseName = "the -baseline-carve agent, same run"
		}
		cpu.Add(benchtable.Row{Name: fmt.Sprintf("idle agent CPU, %d peers", n), Value: cur.cpuPerMin, Unit: "CPU s/min",
			Baseline: baseName, BaseVal: base.cpuPerMin, Note: "target < 0.6 (1% of a core)"})
		note := "target < 2 s; serving: overlay OK and every peer programmed"
		for _, r := range []struct {
			name string
			res  idleResult
		}{{"this agent", cur}, {"baseline", base}} {
			if r.res.stopErr != nil {
				note += fmt.Sprintf("; %s did not stop cleanly: %v", r.name, r.res.stopErr)
			}
		}
		cpu.Add(benchtable.Row{Name: fmt.Sprintf("agent restart -> serving, %d peers", n), Value: cur.restart.Seconds(), Unit: "s",
			Baseline: baseName, BaseVal: base.restart.Seconds(), Note: note})
	}
	return cpu.Print(os.Stdout)
}

// bytesRows measures the membership and ring messages at n agents.
func bytesRows(tbl *benchtable.Table, n int) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	const cluster = "bench-cluster"
	record := func(i int, v uint64) agent.PeerRecord {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i / 250), byte(i%250 + 1)})
		info := &api.AgentInfo{AgentID: fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i), IP: ip.String(), MeshAddr: ip.String() + ":6783", Version: v,
			Overlays: []api.AgentOverlay{{Info: api.OverlayNetwork{Name: "carve"},
				Subnet:      fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256),
				MesosBridge: &api.BridgeInfo{IP: fmt.Sprintf("10.%d.%d.0/25", 128+i/256, i%256)},
				Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VTEPIP: fmt.Sprintf("100.64.%d.%d/16", i/250, i%250+1),
					VTEPMAC: api.VTEPMAC([3]byte{0x70, 0xb3, 0xd5}, netip.AddrFrom4([4]byte{100, 64, byte(i / 250), byte(i%250 + 1)})).String()}},
				State: api.OverlayState{Status: api.StatusOK}}}}
		info.Signature = api.Sign(priv, api.RecordSigningBytes(info, cluster))
		return agent.NewPeerRecord(info)
	}
	a := agent.NewMembership()
	var st agent.MembershipState
	for i := range n {
		st.Records = append(st.Records, record(i, uint64(100+i)))
	}
	a.MergeFromMasters(st)
	b := agent.NewMembership()
	b.MergeFromMasters(a.State())

	whole, err := json.Marshal(agent.MembershipMessage{ClusterID: cluster, MembershipState: a.State()})
	if err != nil {
		return err
	}
	changed := record(n/2, uint64(100+n+1))
	delta, err := json.Marshal(agent.MembershipMessage{ClusterID: cluster, MembershipState: agent.MembershipState{Records: []agent.PeerRecord{changed}}})
	if err != nil {
		return err
	}
	equal := agent.AntiEntropyRound(cluster, "a", a, b)
	a.MergeFromMasters(agent.MembershipState{Records: []agent.PeerRecord{changed}})
	oneOff := agent.AntiEntropyRound(cluster, "a", a, b)
	if again := agent.AntiEntropyRound(cluster, "a", a, b); again.Messages != 1 {
		return fmt.Errorf("%d agents: one round did not reconcile the memberships (%+v)", n, again)
	}
	base := "whole membership (periodic gossip before)"
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("membership: one change, broadcast delta (%d agents)", n), Value: float64(len(delta)), Unit: "B/msg",
		Baseline: base, BaseVal: float64(len(whole))})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("membership: anti-entropy round, in sync (%d agents)", n), Value: float64(equal.Total()), Unit: "B/round",
		Baseline: base, BaseVal: float64(len(whole)), Note: "the digest alone"})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("membership: anti-entropy round, one record behind (%d agents)", n), Value: float64(oneOff.Total()), Unit: "B/round",
		Baseline: base, BaseVal: float64(len(whole)), Note: fmt.Sprintf("digest %d + summary %d + push %d", oneOff.Digest, oneOff.Summary, oneOff.Push)})

	// One overlay ring with a lease per agent.
	alloc, err := ring.NewAllocator("self", netip.MustParsePrefix("10.128.0.0/9"))
	if err != nil {
		return err
	}
	var leases []ring.Lease
	for i := range n {
		leases = append(leases, ring.Lease{Owner: fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i),
			Prefix: netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256)), Version: uint64(100 + i)})
	}
	if _, err := alloc.Seed(leases, nil); err != nil {
		return err
	}
	// The ring channel's messages (agent/ipam's ringMessage), mirrored.
	type entry struct {
		Overlay string `json:"overlay"`
		Family  string `json:"family"`
		Ring    []byte `json:"ring"`
	}
	type digest struct {
		Overlay string `json:"overlay"`
		Family  string `json:"family"`
		Hash    uint64 `json:"hash"`
	}
	type msg struct {
		ClusterID string   `json:"cluster_id,omitempty"`
		Rings     []entry  `json:"rings,omitempty"`
		From      string   `json:"from,omitempty"`
		Digest    []digest `json:"digest,omitempty"`
	}
	wholeRing, _ := json.Marshal(msg{ClusterID: cluster, Rings: []entry{{"carve", "4", alloc.EncodeRing()}}})
	ringDigest, _ := json.Marshal(msg{ClusterID: cluster, From: "00000000-5c1e-4f7a-9d2b-000000000000", Digest: []digest{{"carve", "4", 1 << 63}}})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("rings: anti-entropy round, in sync, one overlay (%d agents)", n), Value: float64(len(ringDigest)), Unit: "B/round",
		Baseline: "every ring (periodic gossip before)", BaseVal: float64(len(wholeRing)), Note: "the digest alone"})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("rings: a registration, per agent (%d agents)", n), Value: 0, Unit: "B/agent",
		Baseline: "each agent broadcast its changed ring before", BaseVal: float64(len(wholeRing)),
		Note: "every agent seeds the new lease from its own view"})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("rings: a change made through the ring (grant, free counts) (%d agents)", n), Value: float64(len(wholeRing)), Unit: "B/msg",
		Baseline: "every ring (periodic gossip before)", BaseVal: float64(len(wholeRing)), Note: "the changed ring, whole: ring-entry deltas are not done"})
	return nil
}

type idleResult struct {
	cpuPerMin float64
	restart   time.Duration
	// stopErr: the agent did not stop cleanly before the restart (it
	// was killed; the restart is still timed).
	stopErr error
}

// measureIdle runs a one-host cluster (master and agent), registers n
// synthetic agents, waits until the agent programmed them all, settles,
// and reads the agent's CPU time over the idle window; then restarts the
// agent and times it until it serves again.
func measureIdle(ctx context.Context, binary string, n int, idle time.Duration) (res idleResult, err error) {
	c, err := labcluster.New(labcluster.Options{Binary: binary, Hosts: 1, Masters: 1, Prefix: prefix, LogLevel: "warn"})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	if err := c.Start(ctx); err != nil {
		return res, err
	}
	h := c.Host(1)
	if err := register(ctx, c.Client(), n); err != nil {
		return res, err
	}
	if err := waitProgrammed(ctx, c, h, n, 10*time.Minute); err != nil {
		return res, err
	}
	// Let the start-up work (the first resyncs, gossip of the new
	// records) pass: idle is what follows.
	if !retry.Sleep(ctx, 30*time.Second) {
		return res, ctx.Err()
	}
	pid := h.Agent.PID()
	before, err := cpuSeconds(pid)
	if err != nil {
		return res, err
	}
	if !retry.Sleep(ctx, idle) {
		return res, ctx.Err()
	}
	after, err := cpuSeconds(pid)
	if err != nil {
		return res, err
	}
	res.cpuPerMin = (after - before) / idle.Minutes()

	res.stopErr = c.StopAgent(ctx, h)
	start := time.Now()
	if err := c.StartAgent(h); err != nil {
		return res, err
	}
	if _, err := c.WaitAgent(ctx, h); err != nil {
		return res, err
	}
	if err := waitProgrammed(ctx, c, h, n, 5*time.Minute); err != nil {
		return res, err
	}
	res.restart = time.Since(start)
	return res, nil
}

// register registers n synthetic agents (addresses in 198.19.0.0/16, no
// process behind them) with 32 concurrent clients.
func register(ctx context.Context, cl *api.Client, n int) error {
	work := make(chan int)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ip := netip.AddrFrom4([4]byte{198, 19, byte(i / 250), byte(i%250 + 1)})
				req := api.RegisterRequest{AgentID: fmt.Sprintf("synthetic-%05d", i), IP: ip.String(), MeshAddr: ip.String() + ":6783",
					NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}
				if _, err := cl.Register(ctx, req); err != nil {
					errs <- fmt.Errorf("register %s: %w", req.AgentID, err)
					return
				}
			}
		}()
	}
	var err error
	for i := 0; i < n && err == nil; i++ {
		select {
		case work <- i:
		case err = <-errs:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	return errors.Join(err, <-errs)
}

// waitProgrammed waits until the agent on h reports at least n programmed peers.
func waitProgrammed(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, n int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	last := 0
	for {
		if p, err := c.AgentClient(h).Peers(ctx); err == nil {
			last = 0
			for _, peer := range p.Peers {
				if peer.Programmed {
					last++
				}
			}
			if last >= n {
				return nil
			}
		}
		if !retry.Sleep(ctx, 500*time.Millisecond) {
			return fmt.Errorf("agent programmed %d of %d peers: %w", last, n, ctx.Err())
		}
	}
}

// cpuSeconds is a process's user and system CPU time, from /proc.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}
