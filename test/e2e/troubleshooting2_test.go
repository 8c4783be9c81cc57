package e2e

// More of docs/troubleshooting.md run on the faults it names (issue 27),
// as troubleshooting_test.go does (see its package comment): a host whose
// FORWARD policy is DROP, a full overlay, the kernel steps of a container
// without connectivity, isolated addresses. Masters whose states differ,
// which the lab cannot cause for real, is skipped with the reason.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestTroubleshootingForwardDrop: host 1's FORWARD policy is DROP (in
// iptables-nft, the backend plain iptables is on Debian 12) before its
// agent starts, as dockerd does. The section's commands show the policy,
// carve's jump first in FORWARD, its chains with the VTEP and the log line
// saying the rules went in; the pings pass. Then the rules are flushed (a
// dockerd restart, iptables -F): the section's fix, the next resync,
// puts them back, the log says reinstalled and the pings pass. Last, the
// agent stopped: FORWARD holds the DROP policy alone and the pings stop
// until it starts again.
func TestTroubleshootingForwardDrop(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A host whose FORWARD policy is DROP")
	// A resync every 5 s: the section's fix (the next resync) comes soon.
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, AgentArgs: []string{"--resync-interval", "5s"}})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	h1 := c.Host(1)
	if _, err := hostIptables(ctx, h1, "iptables", "-w", "-P", "FORWARD", "DROP"); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	waitPings(ctx, t, cs)

	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "iptables -S FORWARD")
	requireCommand(t, cmds, "iptables -S CARVE-FORWARD")
	requireCommand(t, cmds, "iptables -S CARVE-FORWARD-OUT")
	logLine := startingWithLine(t, cmds, "journalctl -u carve-agent")
	res := o.runAll(ctx, t, h1, cmds, nil)
	vtep := netconfig.Default().VTEPName
	for cmd, want := range map[string][]string{
		"iptables -S FORWARD":           {"-P FORWARD DROP", "-A FORWARD -j CARVE-FORWARD"},
		"iptables -S CARVE-FORWARD ":    {"-i " + vtep + " -j CARVE-FORWARD-OUT"},
		"iptables -S CARVE-FORWARD-OUT": {"-o " + vtep + " -j ACCEPT"},
		"journalctl -u carve-agent":     {"FORWARD accept rules installed"},
	} {
		out := startingWith(t, res, cmd).out
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s does not show %q, as the section says:\n%s", cmd, w, out)
			}
		}
	}
	// The policy and carve's jump first: the section's "| head -3".
	if out := startingWith(t, res, "iptables -S FORWARD").out; !strings.Contains(strings.Join(strings.SplitN(out, "\n", 3)[:2], "\n"), "-A FORWARD -j CARVE-FORWARD") {
		t.Errorf("carve's jump is not the first rule of FORWARD:\n%s", out)
	}

	// The rules flushed, as the section's second fix describes.
	if !strings.Contains(strings.Join(strings.Fields(sec.Fixes), " "), "the next resync (`CARVE_RESYNC_INTERVAL`, 30 s) puts them back first") {
		t.Fatalf("the section no longer has the next resync put flushed rules back:\n%s", sec.Fixes)
	}
	for _, args := range [][]string{{"-D", "FORWARD", "-j", "CARVE-FORWARD"}, {"-F", "CARVE-FORWARD"}} {
		if _, err := hostIptables(ctx, h1, append([]string{"iptables", "-w"}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	waitPings(ctx, t, cs)
	testutil.Eventually(t, converge, "host 1's agent logs the repair", func() error {
		r, _ := o.run(ctx, t, h1, logLine, nil)
		if !strings.Contains(r.out, "FORWARD accept rules were missing or not first in FORWARD") || !strings.Contains(r.out, "reinstalled") {
			return fmt.Errorf("%s: no line saying the rules were reinstalled:\n%s", logLine, r.out)
		}
		return nil
	})
	forward := startingWithLine(t, cmds, "iptables -S FORWARD")
	if r, _ := o.run(ctx, t, h1, forward, nil); !strings.Contains(r.out, "-A FORWARD -j CARVE-FORWARD") {
		t.Errorf("carve's jump is not back in FORWARD after the resync:\n%s", r.out)
	}

	// The agent stopped (the section's last fix): its rules go with it,
	// and the policy drops host 1's cross-host traffic until it restarts.
	if !strings.Contains(strings.Join(strings.Fields(sec.Fixes), " "), "While the agent is stopped its rules are gone") {
		t.Fatalf("the section no longer says a stopped agent's rules are gone:\n%s", sec.Fixes)
	}
	if err := c.StopAgent(ctx, h1); err != nil {
		t.Fatal(err)
	}
	if r, _ := o.run(ctx, t, h1, forward, nil); !strings.Contains(r.out, "-P FORWARD DROP") || strings.Contains(r.out, "CARVE-FORWARD") {
		t.Errorf("with host 1's agent stopped, FORWARD is not the DROP policy without carve's jump:\n%s", r.out)
	}
	if m := labcluster.Ping(ctx, cs); m.Err() == nil {
		t.Errorf("pings cross host 1, whose FORWARD policy drops, with its agent stopped:\n%s", m)
	}
	if err := c.StartAgent(h1); err != nil {
		t.Fatal(err)
	}
	waitPings(ctx, t, cs)
}

// TestTroubleshootingContainerKernel: step 3 of "A container without
// connectivity", the kernel as root on a host, on a cluster whose
// containers ping: the VTEP up with its VNI and port and learning off, a
// neighbour and an FDB entry per peer (its VTEP IP, its underlay IP), a
// route per peer subnet, the bridge with its gateway; each as the
// section's comments say.
func TestTroubleshootingContainerKernel(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A container without connectivity")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 1, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	waitPings(ctx, t, cs)

	cfg := netconfig.Default()
	var kernel []string
	for _, l := range codeLines(sec.Commands) {
		if strings.HasPrefix(l, "ip ") || strings.HasPrefix(l, "bridge ") {
			kernel = append(kernel, l)
		}
	}
	for _, p := range []string{"ip -d link show " + cfg.VTEPName, "ip neigh show dev " + cfg.VTEPName, "bridge fdb show dev " + cfg.VTEPName, "ip route show proto 202", "ip addr show m-carve"} {
		requireCommand(t, kernel, p)
	}
	h1 := c.Host(1)
	peers, err := c.AgentClient(h1).Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(peers.Peers) != 2 {
		t.Fatalf("host 1 has %d peers, want 2: %+v", len(peers.Peers), peers.Peers)
	}
	res := o.runAll(ctx, t, h1, kernel, nil)
	link := startingWith(t, res, "ip -d link show").out
	for _, w := range []string{fmt.Sprintf("vxlan id %d", cfg.VNI), fmt.Sprintf("dstport %d", cfg.VTEPPort), "nolearning", ",UP"} {
		if !strings.Contains(link, w) {
			t.Errorf("ip -d link show %s does not show %q (the section: up, its VNI, port %d, learning off):\n%s", cfg.VTEPName, w, cfg.VTEPPort, link)
		}
	}
	neigh := startingWith(t, res, "ip neigh show").out
	fdb := startingWith(t, res, "bridge fdb show").out
	routes := startingWith(t, res, "ip route show proto 202").out
	for _, p := range peers.Peers {
		vtepIP, _, _ := strings.Cut(p.VTEPIP, "/")
		if !strings.Contains(neigh, vtepIP+" ") || !strings.Contains(neigh, p.VTEPMAC) {
			t.Errorf("ip neigh has no entry for %s's VTEP IP %s (%s):\n%s", p.AgentID, vtepIP, p.VTEPMAC, neigh)
		}
		if !strings.Contains(fdb, p.VTEPMAC+" dst "+p.IP+" ") {
			t.Errorf("bridge fdb has no entry %s to %s's underlay IP %s:\n%s", p.VTEPMAC, p.AgentID, p.IP, fdb)
		}
		for _, s := range p.Subnets {
			if !strings.Contains(routes, s+" via "+vtepIP) {
				t.Errorf("ip route show proto 202 has no route %s via %s (%s):\n%s", s, vtepIP, p.AgentID, routes)
			}
		}
	}
	gw := cs[0].Gateway.String()
	if out := startingWith(t, res, "ip addr show m-carve").out; !strings.Contains(out, "inet "+gw+"/") {
		t.Errorf("ip addr show m-carve does not show the gateway %s of host 1's container:\n%s", gw, out)
	}
}

// TestTroubleshootingFullOverlay: an overlay of two /28s (a /27), one host. Filled
// with containers until an ADD fails with exhausted; the agent logs the
// overlay running out, the section's commands show the blocks with no free
// address and carve cluster status the problem line the section quotes.
// Its fix for a whole overlay full, another overlay in network.json
// applied with carve config apply as the section writes it, lets ADDs
// succeed on the new overlay.
func TestTroubleshootingFullOverlay(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A full overlay")
	netCfg := netconfig.Default()
	netCfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/27", Prefix: 28}}
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 1, Masters: 1, Prefix: prefix, Network: &netCfg})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h1 := c.Host(1)
	var filled []*labcluster.Container
	for i := 0; ; i++ {
		if i > 32 {
			t.Fatalf("%d ADDs on a /27 and none failed", i)
		}
		ct, err := c.AddCNIContainer(ctx, h1, "carve", labcluster.CNIOptions{})
		if err != nil {
			if !strings.Contains(err.Error(), "exhausted") {
				t.Fatalf("ADD %d failed, not with exhausted as the section says: %v", i+1, err)
			}
			t.Logf("ADD %d: %v", i+1, err)
			break
		}
		filled = append(filled, ct)
	}
	if len(filled) < 2 {
		t.Fatalf("only %d containers in a /27", len(filled))
	}

	quoted := inlineCommands(sec.Symptom, "... is full")
	if len(quoted) != 1 {
		t.Fatalf("the section's symptom quotes %d \"... is full\" problems, want 1:\n%s", len(quoted), sec.Symptom)
	}
	full := "overlay carve (IPv4) " + strings.TrimPrefix(quoted[0], "... ")
	testutil.Eventually(t, converge, "carve cluster status reports the overlay full", func() error {
		st, _ := o.run(ctx, t, h1, "carve cluster status $OP", nil)
		if st.exited == 0 || !problemNaming(st.out, full) {
			return fmt.Errorf("carve cluster status (exit %d) has no problem %q, as the section says:\n%s", st.exited, full, st.out)
		}
		return nil
	})
	warned := inlineCommands(sec.Symptom, "overlay running out of addresses")
	if len(warned) != 1 {
		t.Fatalf("the section's symptom quotes %d agent logs of an overlay running out, want 1:\n%s", len(warned), sec.Symptom)
	}
	// The agent checks once a minute: up to a minute after the ADDs failed.
	testutil.Eventually(t, 2*converge, "host 1's agent logs the overlay running out", func() error {
		data, err := os.ReadFile(h1.Agent.LogPath)
		if err == nil && !strings.Contains(string(data), warned[0]) {
			err = fmt.Errorf("host 1's agent log does not say %q, as the section says", warned[0])
		}
		return err
	})
	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "carve ipam show --overlay carve $OP")
	requireCommand(t, cmds, "carve state $OP")
	res := o.runAll(ctx, t, h1, cmds, nil)
	show := startingWith(t, res, "carve ipam show")
	if show.exited != 0 || !strings.Contains(show.out, "10.128.0.") || !strings.Contains(show.out, " 0 IPv4 free") {
		t.Errorf("carve ipam show --overlay carve (exit %d) does not show host 1's blocks of 10.128.0.0/27 with no free address:\n%s%s", show.exited, show.out, show.stderr)
	}
	if st := startingWith(t, res, "carve state"); st.exited != 0 || !strings.Contains(st.out, "10.128.0.") {
		t.Errorf("carve state (exit %d) does not show host 1's subnet of 10.128.0.0/27:\n%s%s", st.exited, st.out, st.stderr)
	}

	// The fix: another overlay, applied.
	apply := inlineCommands(sec.Fixes, "carve config apply network.json")
	if len(apply) != 1 {
		t.Fatalf("the section's fixes name %d `carve config apply network.json` commands, want 1: %q", len(apply), apply)
	}
	netCfg.Overlays = append(netCfg.Overlays, api.OverlayNetwork{Name: "more", Subnet: "10.129.0.0/24", Prefix: 26})
	data, err := json.MarshalIndent(netCfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.dir, "network.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, _ := o.run(ctx, t, h1, apply[0], nil); r.exited != 0 {
		t.Fatalf("%s (exit %d):\n%s%s", apply[0], r.exited, r.out, r.stderr)
	}
	var more []*labcluster.Container
	testutil.Eventually(t, converge, "an ADD on the new overlay", func() error {
		ct, err := c.AddCNIContainer(ctx, h1, "more", labcluster.CNIOptions{})
		if err != nil {
			return err
		}
		more = append(more, ct)
		return nil
	})
	if _, err := c.AddCNIContainer(ctx, h1, "more", labcluster.CNIOptions{}); err != nil {
		t.Errorf("a second ADD on the new overlay: %v", err)
	}
	t.Logf("new overlay: %s", more[0])
}

// TestTroubleshootingIsolatedAddresses: a snapshot saved, host 1 grows a
// block from the masters and puts containers in it, the snapshot restored
// onto an empty data directory (a whole-cluster restore): the masters'
// records no longer hold the block, and host 1 isolates its containers'
// addresses there (its metric counts them). The section's
// commands show the address outside, its holder, and the log line the
// section quotes. The fix, restarting the containers named (DEL, then an
// ADD), ends the isolation.
func TestTroubleshootingIsolatedAddresses(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "Isolated addresses")
	netCfg := netconfig.Default()
	// Four /28s: one leased to each host, two left to grow into.
	netCfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/26", Prefix: 28}}
	// A resync every 5 s: the isolation metric follows the DEL at the next
	// sync with the masters' state, as the section says.
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, Network: &netCfg,
		AgentArgs: []string{"--resync-interval", "5s"}})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h1 := c.Host(1)
	if r, _ := o.run(ctx, t, h1, "carve snapshot save carve.json $OP", nil); r.exited != 0 {
		t.Fatalf("carve snapshot save (exit %d):\n%s%s", r.exited, r.out, r.stderr)
	}
	// grownIn are host 1's containers in blocks it grew after the snapshot.
	grownIn := func(h *labcluster.Host, cs []*labcluster.Container) []*labcluster.Container {
		st := ipamStatus(ctx, t, c, h, "carve")
		var out []*labcluster.Container
		for _, ct := range cs {
			if b := blockOf(st, ct.Addr.Addr()); b != nil && b.Origin == api.BlockGrown {
				out = append(out, ct)
			}
		}
		return out
	}
	var on1 []*labcluster.Container
	for len(grownIn(h1, on1)) == 0 {
		if len(on1) > 12 {
			t.Fatalf("%d containers on host 1 and none in a grown block", len(on1))
		}
		ct, err := c.AddCNIContainer(ctx, h1, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		on1 = append(on1, ct)
	}
	held := grownIn(h1, on1)
	// The whole-cluster restore (operations.md, section 9a): the master's
	// data directory moved away, the master started on an empty one with
	// --restore-from. A restore into the running cluster keeps a live
	// agent's grown blocks; a new log knows nothing of them.
	m := c.Masters()[0]
	if err := c.StopMaster(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.DataDir += ".new"
	if err := c.StartMasterWith(m, "--restore-from", filepath.Join(o.dir, "carve.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	isolated := func() (float64, error) {
		return labcluster.MetricSample(ctx, c.HTTPClient(), h1.AgentURL(), `carve_agent_ipam_isolated_addresses{overlay="carve"}`)
	}
	testutil.Eventually(t, converge, "host 1 isolates the addresses of its grown block", func() error {
		v, err := isolated()
		if err == nil && v != float64(len(held)) {
			err = fmt.Errorf("carve_agent_ipam_isolated_addresses %v, want %d (%v)", v, len(held), held)
		}
		return err
	})
	addr := held[0].Addr.Addr().String()

	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "carve ipam check $OP")
	requireCommand(t, cmds, "carve ipam show --ip 10.128.4.2 $OP")
	logLine := startingWithLine(t, cmds, "journalctl -u carve-agent")
	res := o.runAll(ctx, t, h1, cmds, map[string]string{"10.128.4.2": addr})
	if r := startingWith(t, res, "carve ipam check"); r.exited != 1 || !strings.Contains(r.out, "outside") || !strings.Contains(r.out, addr) {
		t.Errorf("carve ipam check (exit %d) does not report %s outside, as the section says:\n%s", r.exited, addr, r.out)
	}
	if r := startingWith(t, res, "carve ipam show --ip"); r.exited != 0 || !strings.Contains(r.out, h1.AgentID()) {
		t.Errorf("carve ipam show --ip %s (exit %d) does not name host 1's agent %s, which holds it:\n%s%s", addr, r.exited, h1.AgentID(), r.out, r.stderr)
	}
	// The section quotes both log lines of an isolation: a block taken
	// back (this one), and an address leased to another agent.
	quoted := inlineCommands(sec.Symptom, "the masters' records ")
	if len(quoted) != 2 {
		t.Fatalf("the section's symptom quotes %d log lines of the isolation, want 2:\n%s", len(quoted), sec.Symptom)
	}
	out := startingWith(t, res, "journalctl -u carve-agent").out
	if !slices.ContainsFunc(quoted, func(q string) bool { return strings.Contains(out, q) }) || !strings.Contains(out, addr) {
		t.Errorf("%s shows none of %q for %s:\n%s", logLine, quoted, addr, out)
	}

	if fixes := strings.Join(strings.Fields(sec.Fixes), " "); !strings.Contains(fixes, "Restart the containers named") || !strings.Contains(fixes, "follows at the agent's next sync") {
		t.Fatalf("the section's fix no longer restarts the containers named, the metric following at the next sync:\n%s", sec.Fixes)
	}
	for _, ct := range held {
		if err := c.DelCNIContainer(ctx, ct); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, converge, "host 1 isolates nothing", func() error {
		v, err := isolated()
		if err == nil && v != 0 {
			err = fmt.Errorf("carve_agent_ipam_isolated_addresses %v", v)
		}
		return err
	})
	if _, err := c.AddCNIContainer(ctx, h1, "carve", labcluster.CNIOptions{}); err != nil {
		t.Errorf("the ADD that restarts a container on host 1: %v", err)
	}
}

// TestTroubleshootingMastersDiverged names the section the lab does not
// cause for real, with the reason.
func TestTroubleshootingMastersDiverged(t *testing.T) {
	readGuide(t).section(t, "Masters whose states differ")
	t.Skip("not caused for real: masters that applied the same Raft log hold the same state; a divergence takes a bug in the replication, and faking one (editing a master's data dir) would test the fake, not the recipe")
}
