package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// The rogue agent's knobs, read from the environment.
const (
	// rogueSeedsEnv replays chosen seeds ("7" or "7,8"), or draws two new
	// ones ("random", printed); by default rogueKnobs' fixed seeds run.
	rogueSeedsEnv = "CARVE_ROGUE_SEEDS"
	// rogueDurationEnv is how long the rogue acts per seed (default
	// rogueDuration): CARVE_ROGUE_DURATION=5m for a long run.
	rogueDurationEnv = "CARVE_ROGUE_DURATION"
	rogueDuration    = 12 * time.Second
	// rogueInterval is how often the rogue peer broadcasts its message.
	rogueInterval = 200 * time.Millisecond
	// rogueOtherOverlay is a second overlay, whose universe the rogue
	// replays carve's ring in.
	rogueOtherOverlay = "rogue-other"
	// rogueChurn is how many containers each honest host keeps attached
	// beside its anchor while the rogue acts.
	rogueChurn = 3
	// routeSettle bounds how long a route to an honest container may take
	// to reach the other honest kernels.
	routeSettle = 10 * time.Second
)

// TestRogueAgent is issue 26's adversarial agent, beside honest ones: host
// 1 is compromised (its agent certificate, claim key and the mesh password;
// its agent stopped, the attacker in its place), hosts 2 and 3 attach and
// delete CNI containers while it acts, for a bounded time, every step drawn
// from a seeded RNG (rogueAgent: unsolicited ring grants of its own space
// to honest hosts, one range granted to both, blocks grown, granted through
// the ring and returned to the masters at once, grant statements reported
// and replayed, also after the operator restored (`carve snapshot
// restore`) a snapshot saved before the rogue acted, earlier ring messages
// replayed, in another overlay and family too, and registrations carrying
// another host's IP, mesh_addr, claim key, WireGuard key or agent id). The
// checker asserts that
//
//   - after every step, no address is held twice in the honest agents'
//     allocation lists, nor (once the agents caught up) any range in the
//     space they hand addresses out from (their IPAM status's blocks): held
//     by two of them, or not given to its holder by the masters' records;
//     every honest host's kernel (netlink, in its namespace)
//     routes every container attached on another honest host to that
//     host's VTEP, no registration with another host's identity or keys
//     was taken, and no statement that moved space moved it again after
//     the restore;
//   - every honest ADD and DEL succeeds, during the run and after it (no
//     honest overlay stops serving);
//   - at the end no address is held twice, in the honest agents'
//     allocation lists and in `carve ipam check` (whose only finding may
//     be the rogue's stopped agent, unreachable), every honest container
//     pings every other, and the honest agents counted the rogue's
//     unsolicited grants as refused.
//
// Each seed runs its own cluster; the seed is printed, and
// CARVE_ROGUE_SEEDS replays it (the rogue's choices, not the timing).
// CARVE_ROGUE_DURATION makes the run longer. To see the checker fail, point
// CARVE_BINARY at a carve built with a sabotaged agent (docs/development.md,
// "The rogue agent").
func TestRogueAgent(t *testing.T) {
	t.Parallel() // its own clusters: see the package comment
	seeds, dur := rogueKnobs(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("rogue seed %d for %s (replay: %s=%d)", seed, dur, rogueSeedsEnv, seed)
			rogueScenario(t, seed, dur)
		})
	}
}

// rogueKnobs reads the seeds and the duration from the environment.
func rogueKnobs(t *testing.T) ([]uint64, time.Duration) {
	t.Helper()
	dur := rogueDuration
	if s := os.Getenv(rogueDurationEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration (5m)", rogueDurationEnv, s)
		}
		dur = d
	}
	s := os.Getenv(rogueSeedsEnv)
	switch s {
	case "":
		// Fixed in make test, so that CI replays the same runs; random
		// draws explore. 8305642479575876046 reports a grant to h3 that
		// the restore then took back (restores now keep it: keep_live),
		// inside a larger range the rogue had granted h3 through the
		// ring unasked: h3 went on handing out the block (docs/design.md,
		// "The space an agent allocates in").
		return []uint64{1, 2, 8305642479575876046}, dur
	case "random":
		return []uint64{rand.Uint64(), rand.Uint64()}, dur
	}
	var seeds []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want seeds separated by commas (7,8)", rogueSeedsEnv, s)
		}
		seeds = append(seeds, n)
	}
	return seeds, dur
}

// rogueScenario is one seed's run: its own cluster, the rogue acting for
// dur beside the honest churn, then the checker.
func rogueScenario(t *testing.T, seed uint64, dur time.Duration) {
	cfg := netconfig.Default()
	cfg.Overlays = append(cfg.Overlays, api.OverlayNetwork{Name: rogueOtherOverlay, Subnet: "10.96.0.0/16", Prefix: 24})
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 1, Prefix: prefix, Network: &cfg})
	ctx := within(t, 4*converge+dur)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	bad, honest := c.Host(1), []*labcluster.Host{c.Host(2), c.Host(3)}
	var anchors []*labcluster.Container
	for _, h := range honest {
		ct, err := c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		anchors = append(anchors, ct)
	}
	pingAll(ctx, t, anchors)
	vteps := map[*labcluster.Host]netip.Addr{}
	for _, h := range honest {
		vteps[h] = vtepOf(ctx, t, c, h)
	}

	// The operator's snapshot, before the attacker takes host 1 over.
	snapshot := filepath.Join(t.TempDir(), "before-the-rogue.json")
	args := append([]string{"snapshot", "save", snapshot, "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	if out, err := c.RunCarve(ctx, honest[0], args...); err != nil {
		t.Fatalf("carve snapshot save: %v\n%s", err, out)
	}
	st, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := st.Agents[0]
	for _, a := range st.Agents {
		if a.AgentID == bad.AgentID() {
			rec = a
		}
	}
	if rec.AgentID != bad.AgentID() || rec.Overlay("carve") == nil {
		t.Fatalf("the masters have no record of %s on carve", bad.Name)
	}
	r := &rogueAgent{t: t, c: c, host: bad, honest: honest, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		message: filepath.Join(t.TempDir(), "rogue-ring.json"), snapshot: snapshot, clusterID: st.ClusterID,
		universe: netip.MustParsePrefix(rec.Overlay("carve").Info.Subnet), did: map[string]int{}, outcomes: map[string]int{}}
	if r.key, err = c.ClaimKey(bad); err != nil {
		t.Fatal(err)
	}
	if r.client, err = c.MasterClientAs(bad); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAgent(ctx, bad); err != nil {
		t.Fatal(err)
	}
	first, err := r.grantRing(&rec, nil) // its own ring as its agent had it: harmless
	if err == nil {
		err = r.broadcast("carve", "4", first)
	}
	if err != nil {
		t.Fatal(err)
	}
	peer, err := c.StartRingRogueReloading(bad, fmt.Sprintf("rogue-agent-%d", seed), r.message, rogueInterval)
	if err != nil {
		t.Fatal(err)
	}

	// The honest hosts churn while the rogue acts; every step is followed
	// by the invariants' check.
	actCtx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	churn := startHonestChurn(actCtx, c, honest, seed)
	r.run(actCtx, func() error { return invariants(ctx, c, honest, vteps) })
	live, ops, churnErrs := churn.wait()
	if err := peer.Stop(ctx, 0); err != nil {
		t.Error(err)
	}
	t.Logf("the rogue's steps: %s; the masters' answers: %s; honest ADDs and DELs meanwhile: %d", sortedCounts(r.did), sortedCounts(r.outcomes), ops)
	for _, err := range churnErrs {
		t.Errorf("honest overlay stopped serving: %v", err)
	}

	// The checker, once the rogue is quiet.
	for _, h := range honest { // ADDs still succeed on every honest host
		ct, err := c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Errorf("honest overlay stopped serving: ADD on %s after the rogue: %v", h.Name, err)
			continue
		}
		live = append(live, ct)
	}
	all := append(append([]*labcluster.Container(nil), anchors...), live...)
	checkNoDuplicates(ctx, t, c, honest, all, bad)
	err = retry.Until(ctx, 200*time.Millisecond, func() error { return routedToHonest(c, honest, vteps, all) })
	if err != nil {
		t.Errorf("honest routes: %v", err)
	}
	pingNoStop(ctx, t, all)
	if r.did[stepRingGrant]+r.did[stepEquivocate] > 0 {
		var refused float64
		for _, h := range honest {
			v, err := agentMetric(ctx, c, h, `carve_agent_ring_claims_refused_total{reason="unsolicited_grant"}`)
			if err != nil {
				t.Fatal(err)
			}
			refused += v
		}
		if refused == 0 {
			t.Errorf("the rogue granted its space through the ring, yet no honest agent counted an unsolicited grant: did its messages arrive?\n%s", peer.Tail(20))
		}
	}
}

// vtepOf is h's VTEP IP on carve, as its agent reports it.
func vtepOf(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host) netip.Addr {
	t.Helper()
	info, err := c.AgentClient(h).Overlay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ov := range info.Overlays {
		if ov.Info.Name == "carve" && ov.Backend != nil && ov.Backend.VXLAN != nil {
			return netip.MustParsePrefix(ov.Backend.VXLAN.VTEPIP).Addr()
		}
	}
	t.Fatalf("%s reports no VTEP IP on carve: %+v", h.Name, info)
	return netip.Addr{}
}

// routedToHonest checks every honest host's kernel: the longest match of
// every container of cs on another honest host goes to that host's VTEP.
func routedToHonest(c *labcluster.Cluster, honest []*labcluster.Host, vteps map[*labcluster.Host]netip.Addr, cs []*labcluster.Container) error {
	var probs []string
	for _, h := range honest {
		ks, err := c.Kernel(h)
		if err != nil {
			return err
		}
		for _, ct := range cs {
			if ct.Host == h {
				continue
			}
			if rt, via := longestMatch(ks.Routes, ct.Addr.Addr()); via != vteps[ct.Host] {
				probs = append(probs, fmt.Sprintf("%s routes %s's container %s by %v via %v, want via %s's VTEP %s",
					h.Name, ct.Host.Name, ct.Addr.Addr(), rt, via, ct.Host.Name, vteps[ct.Host]))
			}
		}
	}
	if len(probs) > 0 {
		return errors.New(strings.Join(probs, "; "))
	}
	return nil
}

// heldAddresses reads the honest agents' allocation lists on carve
// (through their IPAM sockets): who holds each address (host/container),
// and an error naming every address held twice.
func heldAddresses(ctx context.Context, c *labcluster.Cluster, honest []*labcluster.Host) (map[netip.Addr]string, error) {
	holder := map[netip.Addr]string{}
	var dups []string
	for _, h := range honest {
		list, err := c.IPAMClient(h).List(ctx, "carve")
		if err != nil {
			return nil, fmt.Errorf("IPAM list of %s: %w", h.Name, err)
		}
		for _, al := range list.Allocations {
			who := h.Name + "/" + al.ContainerID + "/" + al.IfName
			for _, ip := range al.IPs {
				p, err := netip.ParsePrefix(ip.Address)
				if err != nil {
					return nil, fmt.Errorf("%s's allocation %s: %w", h.Name, who, err)
				}
				if prev, dup := holder[p.Addr()]; dup {
					dups = append(dups, fmt.Sprintf("%s by %s and %s", p.Addr(), prev, who))
				}
				holder[p.Addr()] = who
			}
		}
	}
	if len(dups) > 0 {
		return holder, fmt.Errorf("addresses held twice: %s", strings.Join(dups, "; "))
	}
	return holder, nil
}

// checkNoDuplicates asserts that no address is held twice: across the
// honest agents' allocation lists (each live container's address held by
// it, on its host), and in `carve ipam check`, whose only finding may be
// the rogue's stopped agent.
func checkNoDuplicates(ctx context.Context, t *testing.T, c *labcluster.Cluster, honest []*labcluster.Host, live []*labcluster.Container, bad *labcluster.Host) {
	t.Helper()
	holder, err := heldAddresses(ctx, c, honest)
	if err != nil {
		t.Error(err)
	}
	if err := spaceHeldTwice(ctx, c, honest); err != nil {
		t.Error(err)
	}
	for _, ct := range live {
		if want := ct.Host.Name + "/" + ct.ContainerID + "/" + ct.IfName; holder[ct.Addr.Addr()] != want {
			t.Errorf("container %s's address %s is held by %q in the agents' lists", want, ct.Addr.Addr(), holder[ct.Addr.Addr()])
		}
	}
	rep, _ := ipamCheck(ctx, t, c)
	for _, p := range rep.Problems {
		if p.Kind == "unreachable" && len(p.Holders) == 1 && p.Holders[0].AgentID == bad.AgentID() {
			continue
		}
		t.Errorf("carve ipam check: %s %s on %s held by %+v: %s", p.Kind, p.Address, p.Network, p.Holders, p.Detail)
	}
}

// honestNow are the containers attached on the honest hosts now.
func honestNow(c *labcluster.Cluster, honest []*labcluster.Host) []*labcluster.Container {
	var out []*labcluster.Container
	for _, ct := range c.Containers() {
		if slices.Contains(honest, ct.Host) && ct.Overlay == "carve" {
			out = append(out, ct)
		}
	}
	return out
}

// spaceHeldTwice reads the space each honest agent hands addresses out
// from (its IPAM status: every bridge's blocks, both families) and names
// every range two of them hold, and every range one holds that the
// masters' records do not give it (they give it to another agent, the
// rogue or nobody): an address there may go to two containers, whether or
// not one was attached there yet.
func spaceHeldTwice(ctx context.Context, c *labcluster.Cluster, honest []*labcluster.Host) error {
	type held struct {
		host  string
		block netip.Prefix
	}
	st, err := c.State(ctx)
	if err != nil {
		return err
	}
	records := map[string][]netip.Prefix{} // agent id -> what its record gives it
	for i := range st.Agents {
		pr := membership.NewPeerRecord(&st.Agents[i])
		for _, s := range pr.LeasePrefixes() {
			if p, err := netip.ParsePrefix(s); err == nil {
				records[st.Agents[i].AgentID] = append(records[st.Agents[i].AgentID], p)
			}
		}
	}
	var all []held
	var probs []string
	for _, h := range honest {
		st, err := c.IPAMClient(h).Status(ctx, "carve")
		if err != nil {
			return fmt.Errorf("IPAM status of %s: %w", h.Name, err)
		}
		for _, fam := range []map[string][]api.IPAMBlockUsage{st.Blocks, st.Blocks6} {
			for _, bs := range fam {
				for _, b := range bs {
					p, err := netip.ParsePrefix(b.Prefix)
					if err != nil {
						return fmt.Errorf("IPAM status of %s: block %q: %w", h.Name, b.Prefix, err)
					}
					all = append(all, held{h.Name, p})
					if !slices.ContainsFunc(records[h.AgentID()], func(q netip.Prefix) bool { return q.Bits() <= p.Bits() && q.Contains(p.Addr()) }) {
						probs = append(probs, fmt.Sprintf("%s hands out %s, which the masters' records do not give it (they give it %v)", h.Name, p, records[h.AgentID()]))
					}
				}
			}
		}
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.host != b.host && a.block.Overlaps(b.block) {
				probs = append(probs, fmt.Sprintf("%s's %s and %s's %s", a.host, a.block, b.host, b.block))
			}
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("space held twice: %s", strings.Join(probs, "; "))
	}
	return nil
}

// invariants is the check after every rogue step: no address held twice
// by the honest agents' containers (now), and, within routeSettle, no range
// held twice in the space honest agents hand addresses out from
// (spaceHeldTwice) and every honest
// host routing every container attached on another honest host to that
// host's VTEP. (The wait: a block the masters just moved, by a grant the
// rogue reported or a restore, reaches the other agents and kernels a
// moment after its new holder has it; what a sabotaged agent adopts stays.)
func invariants(ctx context.Context, c *labcluster.Cluster, honest []*labcluster.Host, vteps map[*labcluster.Host]netip.Addr) error {
	if _, err := heldAddresses(ctx, c, honest); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, routeSettle)
	defer cancel()
	var last error
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		err := spaceHeldTwice(ctx, c, honest)
		if err == nil {
			err = routedToHonest(c, honest, vteps, honestNow(c, honest))
		}
		if ctx.Err() == nil || last == nil { // not the wait's own end
			last = err
		}
		return err
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

// honestChurn attaches and deletes CNI containers on the honest hosts
// until its context ends, each host in its own goroutine.
type honestChurn struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	live []*labcluster.Container
	errs []error
	ops  int // ADDs and DELs that succeeded
}

func startHonestChurn(ctx context.Context, c *labcluster.Cluster, honest []*labcluster.Host, seed uint64) *honestChurn {
	ch := &honestChurn{}
	for i, h := range honest {
		ch.wg.Add(1)
		go func() {
			defer ch.wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			var mine []*labcluster.Container
			for ctx.Err() == nil {
				// The churn's own calls outlive ctx by a little: an ADD
				// cut off halfway is no failure of the overlay.
				opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), converge)
				var err error
				if len(mine) >= rogueChurn {
					j := rng.IntN(len(mine))
					if err = c.DelCNIContainer(opCtx, mine[j]); err == nil {
						mine = append(mine[:j], mine[j+1:]...)
					}
				} else {
					var ct *labcluster.Container
					if ct, err = c.AddCNIContainer(opCtx, h, "carve", labcluster.CNIOptions{}); err == nil {
						mine = append(mine, ct)
					}
				}
				cancel()
				ch.mu.Lock()
				if err == nil {
					ch.ops++
				}
				ch.mu.Unlock()
				if err != nil {
					ch.mu.Lock()
					ch.errs = append(ch.errs, fmt.Errorf("%s: %w", h.Name, err))
					ch.mu.Unlock()
					return
				}
			}
			ch.mu.Lock()
			ch.live = append(ch.live, mine...)
			ch.mu.Unlock()
		}()
	}
	return ch
}

// wait waits for the churn to end and returns the containers left
// attached, how many ADDs and DELs succeeded, and the failed ones.
func (ch *honestChurn) wait() ([]*labcluster.Container, int, []error) {
	ch.wg.Wait()
	return ch.live, ch.ops, ch.errs
}
