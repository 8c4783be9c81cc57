package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

var (
	growthSeeds = flag.Int("growth.seeds", 0, "TestGrowthInvariantAcrossAgents: run this many random seeds besides the fixed ones (env CARVE_GROWTH_SEEDS)")
	growthSeed  = flag.Uint64("growth.seed", 0, "TestGrowthInvariantAcrossAgents: replay only this seed (env CARVE_GROWTH_SEED)")
	growthSteps = flag.Int("growth.steps", 60, "TestGrowthInvariantAcrossAgents: steps of each history")
)

// growthPropertySeeds are the seeds make test runs: each a history of 60
// steps on three agents, a few seconds each.
var growthPropertySeeds = []uint64{1, 2, 3}

func growthSeedList(t *testing.T) []uint64 {
	t.Helper()
	one := *growthSeed
	if v := os.Getenv("CARVE_GROWTH_SEED"); v != "" && one == 0 {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CARVE_GROWTH_SEED=%q: %v", v, err)
		}
		one = n
	}
	if one != 0 {
		return []uint64{one}
	}
	more := *growthSeeds
	if v := os.Getenv("CARVE_GROWTH_SEEDS"); v != "" && more == 0 {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("CARVE_GROWTH_SEEDS=%q: %v", v, err)
		}
		more = n
	}
	seeds := slices.Clone(growthPropertySeeds)
	for range more {
		seeds = append(seeds, rand.Uint64()%1_000_000+100)
	}
	return seeds
}

// TestGrowthInvariantAcrossAgents runs random histories of growth on real
// agents (in network namespaces, gossiping over a fake network) and a real
// signing master: ADDs and DELs on either bridge, restarts, lost data dirs,
// operator deletes followed by the agent coming back, master outages with
// steps in between, and waits for idle blocks to go back. The overlay is a
// /26 cut in /28 slices with /30 grown blocks, so three agents fill it: the
// masters run out and ring grants follow. After every step it checks the
// one-owner invariant: no address is held by two running agents; every
// held address lies in a range the holder's own ring gives it (once its
// ring caught up with the records, see check); an agent
// restarted with its data dir keeps its containers' addresses; the masters'
// blocks of different agents (and the quarantine) never overlap. No ADD
// may fail but with "exhausted" (or not_ready on an agent that came back
// to a full overlay and is leased nothing). The seed and
// the history are printed on failure; -growth.seed=S replays one.
func TestGrowthInvariantAcrossAgents(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root to create network namespaces for the agents")
	t.Parallel() // every history has its own namespaces, master and data dirs
	for _, seed := range growthSeedList(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel() // and mostly waits on its agents
			h := newGrowthHistory(t, seed)
			defer func() {
				if t.Failed() || testing.Verbose() {
					t.Logf("seed %d (replay: go test -run 'TestGrowthInvariantAcrossAgents' -growth.seed=%d ./agent/); history:\n%s",
						seed, seed, strings.Join(h.log, "\n"))
				}
			}()
			h.run(*growthSteps)
		})
	}
}

// propAgent is one agent of a history, and what the test holds on it.
type propAgent struct {
	idx  int
	host *netnslab.Host
	dir  string
	ra   *runningAgent
	// unserved: the agent runs but is leased nothing (it came back after a
	// delete to a full overlay); its ADDs answer not_ready.
	unserved bool
	// held is the container ids this agent was given addresses for, and the
	// addresses.
	held map[string]propHeld
}

type propHeld struct {
	addr   netip.Addr
	bridge string
}

type growthHistory struct {
	t      *testing.T
	rng    *rand.Rand
	dir    string
	key    ed25519.PrivateKey
	cfg    api.NetworkConfig
	gnet   *fakegossip.Network
	m      *master.Master // nil during an outage
	proxy  *masterProxy
	agents []*propAgent
	next   int // container counter
	lost   int // data dir counter
	log    []string
	adds   map[string]int // ADD outcomes
	// seen counts the grown and granted blocks the agents were seen to
	// hold (agent, origin, prefix), so that a run shows what it exercised.
	seen map[[3]string]bool
}

func newGrowthHistory(t *testing.T, seed uint64) *growthHistory {
	t.Helper()
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 3})
	dir := t.TempDir()
	_, key := testKey(t)
	cfg := state.DefaultConfig()
	cfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/26", Prefix: 28, GrowPrefix: 30}}
	h := &growthHistory{t: t, rng: rand.New(rand.NewPCG(seed, 0x67726f77)), dir: dir, key: key, cfg: cfg, adds: map[string]int{}, seen: map[[3]string]bool{}}
	h.m = mastertest.StartSigning(t, filepath.Join(dir, "m1"), cfg, quietLogger(), key)
	h.proxy = newMasterProxy(t, h.m)
	h.gnet = fakegossip.New(fakegossip.Config{Seed: seed, GossipInterval: 100 * time.Millisecond})
	t.Cleanup(h.gnet.Close)
	for i, host := range lab.Hosts() {
		a := &propAgent{idx: i, host: host, dir: filepath.Join(dir, fmt.Sprintf("a%d-0", i)), held: map[string]propHeld{}}
		h.agents = append(h.agents, a)
		h.start(a)
	}
	return h
}

func (h *growthHistory) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf("%3d ", len(h.log))+fmt.Sprintf(format, args...))
}

// start runs a's agent on its data dir and waits until it serves the
// overlay (with the master down, from its persisted state).
func (h *growthHistory) start(a *propAgent) {
	t := h.t
	t.Helper()
	ag := newTestAgent(t, a.host, h.proxy.URL(), a.dir, h.gnet, func(c *Config) {
		c.UsageInterval = 200 * time.Millisecond
		c.BlockIdleReturn = time.Second
		c.ResyncInterval = 2 * time.Second
	})
	a.ra = runAgent(t, ag)
	testutil.Eventually(t, 0, fmt.Sprintf("agent %s serves the overlay (or is told it has no lease)", a.ra.id), func() error {
		st := a.ra.ipam.Status("carve")
		switch {
		case st != nil && st.Ready:
			a.unserved = false
		case st != nil && (strings.Contains(st.Error, "no longer leased") || strings.Contains(st.Error, "has no such overlay")) && (h.m != nil || a.unserved):
			// The overlay has no whole slice free for it; or it had
			// none before it restarted during an outage.
			a.unserved = true
		default:
			return fmt.Errorf("IPAM status %+v; %s", st, h.describeMaster())
		}
		return nil
	})
	if a.unserved {
		h.logf("  %s is leased nothing: %s", a.ra.id, strings.ReplaceAll(h.describeMaster(), "\n", "; "))
	}
}

func (h *growthHistory) run(steps int) {
	t := h.t
	h.check("start")
	for range steps {
		h.step(false)
	}
	if h.m == nil {
		h.masterBack()
	}
	blocks := map[string]int{}
	for k := range h.seen {
		blocks[k[1]]++
	}
	h.logf("end: ADD outcomes %v; blocks seen %v", h.adds, blocks)
	t.Logf("ADD outcomes %v; blocks seen %v", h.adds, blocks)
}

// step runs one random operation; during an outage only those that need no
// master.
func (h *growthHistory) step(outage bool) {
	a := h.agents[h.rng.IntN(len(h.agents))]
	r := h.rng.IntN(100)
	switch {
	case r < 55:
		// Bursts on a hot agent (the first) half of the time, so that
		// it outgrows the masters' free space and asks its peers.
		if h.rng.IntN(2) == 0 {
			a = h.agents[0]
		}
		for range 1 + h.rng.IntN(4) {
			h.add(a)
		}
	case r < 68:
		h.del()
	case r < 74:
		h.restart(a)
	case r < 81 && !outage:
		h.loseDataDir(a)
	case r < 87 && !outage:
		h.deleteAtMaster(a)
	case r < 92 && !outage:
		h.outage()
	case r < 92:
		h.add(a)
	default:
		h.waitIdleReturn()
	}
}

func (h *growthHistory) add(a *propAgent) {
	bridge := api.BridgeMesos
	if h.rng.IntN(4) == 0 {
		bridge = api.BridgeDocker
	}
	h.next++
	c := fmt.Sprintf("c%d", h.next)
	al, err := a.ra.IPAM().Allocate(api.IPAMRequest{Network: "carve", ContainerID: c, IfName: "eth0", Bridge: bridge})
	if err != nil {
		var ae *api.Error
		// Not ready: leased nothing (it came back to a full overlay), or
		// between a tombstone of its own and its new record. Liveness,
		// not the invariant: counted, and the history goes on.
		if errors.As(err, &ae) && (ae.Code == api.CodeNotReady || ae.Code == api.CodeNotFound) {
			h.adds[fmt.Sprintf("not_ready(unserved=%v)", a.unserved)]++
			h.logf("ADD %s on %s (%s): not ready: %s", c, a.ra.id, bridge, ae.Message)
			h.check("after ADD")
			return
		}
		if !errors.As(err, &ae) || ae.Code != api.CodeExhausted {
			h.logf("ADD %s on %s (%s): %v", c, a.ra.id, bridge, err)
			h.t.Fatalf("ADD %s on %s failed with something other than exhausted: %v", c, a.ra.id, err)
		}
		full := strings.Contains(ae.Message, "is full")
		h.adds[fmt.Sprintf("exhausted(full=%v)", full)]++
		h.logf("ADD %s on %s (%s): exhausted (%s)", c, a.ra.id, bridge, ae.Message)
		h.check("after ADD")
		return
	}
	addr, err := allocationAddr(al)
	if err != nil {
		h.t.Fatalf("ADD %s on %s: %v", c, a.ra.id, err)
	}
	a.held[c] = propHeld{addr, bridge}
	h.adds["ok"]++
	h.logf("ADD %s on %s (%s): %s", c, a.ra.id, bridge, addr)
	h.check("after ADD")
}

func allocationAddr(al *api.Allocation) (netip.Addr, error) {
	for _, ip := range al.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocation address %q: %w", ip.Address, err)
		}
		if p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("allocation without an IPv4 address: %+v", al)
}

// del releases a random container of any agent.
func (h *growthHistory) del() {
	var all [][2]string
	for i, a := range h.agents {
		for _, c := range sortedHeld(a.held) {
			all = append(all, [2]string{strconv.Itoa(i), c})
		}
	}
	if len(all) == 0 {
		h.logf("DEL: nothing held")
		return
	}
	pick := all[h.rng.IntN(len(all))]
	i, _ := strconv.Atoi(pick[0])
	a, c := h.agents[i], pick[1]
	if _, err := a.ra.IPAM().Release(api.IPAMRequest{Network: "carve", ContainerID: c, IfName: "eth0"}); err != nil {
		h.t.Fatalf("DEL %s on %s: %v", c, a.ra.id, err)
	}
	h.logf("DEL %s on %s (%s)", c, a.ra.id, a.held[c].addr)
	delete(a.held, c)
	h.check("after DEL")
}

func sortedHeld(m map[string]propHeld) []string {
	out := make([]string, 0, len(m))
	for c := range m {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

func (h *growthHistory) restart(a *propAgent) {
	h.logf("RESTART %s", a.ra.id)
	a.ra.stop(h.t)
	h.start(a)
	h.check("after RESTART")
}

// loseDataDir stops a, removes its data dir and starts it on an empty one:
// it registers again under its (fixed) id and gets its blocks back from
// its record; its containers are gone with the disk (no CNI cache here).
func (h *growthHistory) loseDataDir(a *propAgent) {
	h.logf("LOSE data dir of %s (its containers %v are gone)", a.ra.id, sortedHeld(a.held))
	a.ra.stop(h.t)
	if err := os.RemoveAll(a.dir); err != nil {
		h.t.Fatal(err)
	}
	h.lost++
	a.dir = filepath.Join(h.dir, fmt.Sprintf("a%d-%d", a.idx, h.lost))
	a.held = map[string]propHeld{}
	h.start(a)
	h.check("after LOSE")
}

// deleteAtMaster is the operator deleting a, which asserts that it no
// longer runs: its containers ended (they are released) and it is stopped.
// Then a comes back with its data dir (its ring and the grants it made)
// and registers again under its id.
//
// With CARVE_GROWTH_DELETE_WITH_CONTAINERS=1 its containers are kept in
// its store instead, as when a host the operator deleted comes back with
// its containers: the masters give it back its first lease slice, but not
// the grown blocks its containers hold addresses in (they stay
// quarantined), so its ring refuses the masters' leases and it never
// serves the overlay again (see the report of the growth-prop branch).
func (h *growthHistory) deleteAtMaster(a *propAgent) {
	id := a.ra.id
	keep := os.Getenv("CARVE_GROWTH_DELETE_WITH_CONTAINERS") != ""
	h.logf("DELETE %s at the master (stopped, containers kept: %v), then start it again", id, keep)
	if !keep {
		for _, c := range sortedHeld(a.held) {
			if _, err := a.ra.IPAM().Release(api.IPAMRequest{Network: "carve", ContainerID: c, IfName: "eth0"}); err != nil {
				h.t.Fatalf("DEL %s on %s: %v", c, id, err)
			}
			h.logf("  DEL %s on %s (%s)", c, id, a.held[c].addr)
			delete(a.held, c)
		}
	}
	a.ra.stop(h.t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := masterClient(h.t, h.m).DeleteAgent(ctx, id); err != nil {
		h.t.Fatalf("delete %s: %v", id, err)
	}
	h.start(a)
	h.check("after DELETE")
}

// outage stops the master, runs 1-3 steps that need none, and starts it
// again on its data dir.
func (h *growthHistory) outage() {
	n := 1 + h.rng.IntN(3)
	h.logf("MASTER DOWN for %d steps", n)
	h.m.Close()
	h.m = nil
	for range n {
		h.step(true)
	}
	h.masterBack()
}

func (h *growthHistory) masterBack() {
	h.m = mastertest.StartSigning(h.t, filepath.Join(h.dir, "m1"), h.cfg, quietLogger(), h.key)
	h.proxy.switchTo(h.m)
	h.logf("MASTER UP")
	h.check("after MASTER UP")
}

// waitIdleReturn waits until every grown or granted block without an
// allocation has gone back.
func (h *growthHistory) waitIdleReturn() {
	h.logf("WAIT for idle blocks to go back")
	testutil.Eventually(h.t, 0, "idle blocks grown from the master go back", func() error {
		for _, a := range h.agents {
			if a.unserved {
				continue
			}
			st := a.ra.ipam.Status("carve")
			if st == nil || !st.Ready {
				continue // serves nothing now (see ADD's not ready): nothing to give back
			}
			for bridge, bs := range st.Blocks {
				for _, b := range bs {
					// Only the masters' blocks: see the branch report
					// for an adopted grant that never went back.
					if b.Origin == api.BlockGrown && b.Used == 0 {
						return fmt.Errorf("agent %s still holds idle %s block %s on %s (free %d)\n%s", a.ra.id, b.Origin, b.Prefix, bridge, b.Free, h.describeRings())
					}
				}
			}
		}
		return nil
	})
	h.check("after WAIT")
}

// listed is what a's IPAM lists, container -> IPv4 address.
func (h *growthHistory) listed(a *propAgent) map[string]netip.Addr {
	out := map[string]netip.Addr{}
	for _, al := range a.ra.IPAM().List("carve").Allocations {
		addr, err := allocationAddr(&al)
		if err != nil {
			h.t.Fatalf("agent %s lists %v", a.ra.id, err)
		}
		out[al.ContainerID] = addr
	}
	return out
}

// check checks the invariant after a step: safety at once (what the
// test was given is still held, no address held twice, the master's
// blocks disjoint); the agents' rings once they caught up with the
// records (ringsAgree).
func (h *growthHistory) check(when string) {
	t := h.t
	t.Helper()
	holder := map[netip.Addr]string{}
	for _, a := range h.agents {
		id := a.ra.id
		listed := h.listed(a)
		// The test's model: what it was given, it still holds.
		for c, hd := range a.held {
			if got, ok := listed[c]; !ok || got != hd.addr {
				t.Fatalf("%s: agent %s lost %s's address %s (lists %v %v)", when, id, c, hd.addr, got, ok)
			}
		}
		if st := a.ra.ipam.Status("carve"); st != nil {
			for _, bs := range st.Blocks {
				for _, b := range bs {
					if b.Origin != api.BlockLeased {
						h.seen[[3]string{id, b.Origin, b.Prefix}] = true
					}
				}
			}
		}
		for c, addr := range listed {
			if other, dup := holder[addr]; dup {
				t.Fatalf("%s: DOUBLE ALLOCATION: %s is held by %s and by %s (container %s)\n%s", when, addr, other, id, c, h.describe())
			}
			holder[addr] = id + "/" + c
		}
	}
	// An agent may learn a peer's record by gossip before its own of the
	// same index: a grant the masters recorded to it is then nobody's in
	// its ring until its own record comes, and it stops handing out there
	// and isolates the address, as it must (the space may have gone to a
	// third agent whose record it has not seen yet). So the rings are
	// held to the invariant once they caught up: a held address its ring
	// keeps giving to nobody (a block given back and handed out again) or
	// to another agent fails here.
	testutil.Eventually(t, 0, when+": every held address lies in a range its holder's own ring gives it", h.ringsAgree)
	if h.m == nil {
		return
	}
	st := masterState(t, h.m)
	if err := masterBlocksDisjoint(st); err != nil {
		t.Fatalf("%s: the master's blocks: %v\n%s", when, err, h.describe())
	}
}

// ringsAgree tells whether every address an agent holds lies in a range
// its own ring gives it, and names the first that does not.
func (h *growthHistory) ringsAgree() error {
	for _, a := range h.agents {
		id := a.ra.id
		listed := h.listed(a)
		enc, ok := a.ra.IPAM().Rings()["carve/4"]
		if !ok && len(listed) == 0 {
			// Between a registration and its ring (or told it has no
			// lease), an agent holds nothing the invariant is about.
			continue
		}
		if !ok {
			return fmt.Errorf("agent %s has no IPv4 ring for carve", id)
		}
		r, err := ring.Decode(enc)
		if err != nil {
			return fmt.Errorf("agent %s's ring: %w", id, err)
		}
		for _, c := range slices.Sorted(maps.Keys(listed)) {
			if owner, _ := r.Owner(listed[c]); owner != id {
				return fmt.Errorf("agent %s holds %s (container %s), which its own ring gives to %q\n%s\n%s", id, listed[c], c, owner, h.describe(), h.describeRings())
			}
		}
	}
	return nil
}

// masterBlocksDisjoint checks that no two blocks of the master's state
// (records and quarantine) overlap.
func masterBlocksDisjoint(st *api.State) error {
	type owned struct {
		p   netip.Prefix
		who string
	}
	var all []owned
	for _, ag := range st.Agents {
		for _, ov := range ag.Overlays {
			for _, b := range ov.Blocks {
				p, err := netip.ParsePrefix(b.Prefix)
				if err != nil {
					return fmt.Errorf("agent %s block %q: %w", ag.AgentID, b.Prefix, err)
				}
				all = append(all, owned{p, ag.AgentID + " (" + b.Origin + ")"})
			}
		}
	}
	for _, q := range st.Quarantine {
		p, err := netip.ParsePrefix(q.Prefix)
		if err != nil {
			return fmt.Errorf("quarantined %q: %w", q.Prefix, err)
		}
		all = append(all, owned{p, "quarantine of " + q.From})
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[i].p.Overlaps(all[j].p) {
				return fmt.Errorf("%s of %s overlaps %s of %s", all[i].p, all[i].who, all[j].p, all[j].who)
			}
		}
	}
	return nil
}

// describe is what every agent holds and its blocks, for a failure.
func (h *growthHistory) describe() string {
	var b strings.Builder
	for _, a := range h.agents {
		fmt.Fprintf(&b, "agent %s:", a.ra.id)
		listed := h.listed(a)
		for _, c := range slices.Sorted(maps.Keys(listed)) {
			fmt.Fprintf(&b, " %s=%s", c, listed[c])
		}
		if st := a.ra.ipam.Status("carve"); st != nil {
			for bridge, bs := range st.Blocks {
				for _, bl := range bs {
					fmt.Fprintf(&b, " [%s %s %s used %d free %d]", bridge, bl.Origin, bl.Prefix, bl.Used, bl.Free)
				}
			}
		}
		b.WriteString("\n")
	}
	b.WriteString(h.describeMaster())
	return b.String()
}

// describeMaster is the master's blocks and quarantine, for a failure.
func (h *growthHistory) describeMaster() string {
	var b strings.Builder
	if h.m != nil {
		st := masterState(h.t, h.m)
		for _, ag := range st.Agents {
			fmt.Fprintf(&b, "master: %s:", ag.AgentID)
			for _, ov := range ag.Overlays {
				for _, bl := range ov.Blocks {
					fmt.Fprintf(&b, " [%s %s %s donor %q]", bl.Bridge, bl.Origin, bl.Prefix, bl.Donor)
				}
			}
			b.WriteString("\n")
		}
		for _, q := range st.Quarantine {
			fmt.Fprintf(&b, "master: quarantine %s of %s\n", q.Prefix, q.From)
		}
	}
	return b.String()
}

// describeRings is every agent's IPv4 ring (its view, leases and lease-set
// versions, tombstones), for a failure.
func (h *growthHistory) describeRings() string {
	var b strings.Builder
	for _, a := range h.agents {
		enc, ok := a.ra.IPAM().Rings()["carve/4"]
		if !ok {
			fmt.Fprintf(&b, "agent %s: no ring\n", a.ra.id)
			continue
		}
		r, err := ring.Decode(enc)
		if err != nil {
			fmt.Fprintf(&b, "agent %s: ring: %v\n", a.ra.id, err)
			continue
		}
		fmt.Fprintf(&b, "agent %s: %s\n  leases %v\n  tombstones %v\n", a.ra.id, r, r.Leases(), r.Tombstones())
	}
	return b.String()
}
