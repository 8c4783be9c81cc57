package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// hostIptables runs an iptables binary inside a lab host's namespace
// (ip netns exec): never in the machine's own.
func hostIptables(ctx context.Context, h *labcluster.Host, args ...string) (string, error) {
	argv := h.NS.ExecArgs(args...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s on %s: %w: %s", strings.Join(args, " "), h.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// carveRules is what of carve's a host's filter table holds, in both
// families and both backends ("" when nothing).
func carveRules(ctx context.Context, h *labcluster.Host) (string, error) {
	var found []string
	for _, prog := range []string{"iptables", "ip6tables"} {
		for _, b := range []string{"nft", "legacy"} {
			out, err := hostIptables(ctx, h, prog+"-"+b+"-save", "-t", "filter")
			if err != nil {
				return "", err
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "CARVE") {
					found = append(found, prog+"-"+b+": "+l)
				}
			}
		}
	}
	return strings.Join(found, "\n"), nil
}

// TestForwardPolicyDrop is issue 28's first finding: dockerd sets the
// FORWARD policy to DROP (in the backend its iptables uses) before the
// agent starts, and every container of the host became unreachable from
// the others, silently. Here host 1 drops in iptables-nft (Debian 12's
// default) and host 2 in iptables-legacy, both before their agents start.
//
//  1. The containers of both hosts ping each other: each agent put its
//     accept rules in the backend its host uses.
//  2. The rules flushed on both hosts (the jump and carve's chain), the
//     agents' reconcile puts them back: the pings pass again, and each
//     agent counts a repair.
//  3. A stopped agent leaves nothing of carve's in either backend.
//
// Once with VXLAN between the hosts, once with WireGuard (the packets go
// out through the WireGuard device, in the rules too).
func TestForwardPolicyDrop(t *testing.T) {
	t.Parallel() // its own clusters: see the package comment
	for _, b := range []string{"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"} {
		_, err := exec.LookPath(b)
		testutil.Require(t, err == nil, "needs %s in PATH (Debian: apt-get install iptables; deploy/install-deps.sh installs it)", b)
	}
	for _, encryption := range []string{"", api.EncryptionWireGuard} {
		name := "vxlan"
		if encryption != "" {
			name = encryption
		}
		t.Run(name, func(t *testing.T) { forwardPolicyDrop(t, encryption) })
	}
}

func forwardPolicyDrop(t *testing.T, encryption string) {
	netCfg := netconfig.Default()
	netCfg.Encryption = encryption
	// A resync every second: the repair is seen soon.
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, Network: &netCfg, AgentArgs: []string{"--resync-interval", "1s"}})
	backend := map[int]string{1: "nft", 2: "legacy"}
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}
	var containers []*labcluster.Container

	step("FORWARD DROP before the agents start", func(t *testing.T) {
		ctx := within(t, converge)
		for _, h := range c.Hosts() {
			// What dockerd does at its start, in its backend: a DROP
			// policy and its own chain jumped to from FORWARD.
			for _, args := range [][]string{{"-P", "FORWARD", "DROP"}, {"-N", "DOCKER-USER"}, {"-A", "DOCKER-USER", "-j", "RETURN"}, {"-I", "FORWARD", "1", "-j", "DOCKER-USER"}} {
				if _, err := hostIptables(ctx, h, append([]string{"iptables-" + backend[h.Index], "-w"}, args...)...); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		containers = containerPerHost(ctx, t, c)
		if encryption == "" {
			waitKernelMatchesMasters(ctx, t, c)
		} else if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err) // the encrypted peers leave VXLAN: WireGuard's are not the masters' entries
		}
		pingAll(ctx, t, containers)
		for _, h := range c.Hosts() {
			if encryption != "" {
				st, err := c.AgentClient(h).WireGuard(ctx)
				if err != nil || st.Peers[api.PeerKeyed] != 1 {
					t.Errorf("%s: wireguard status %+v (%v), want the other host keyed: the pings went through WireGuard", h.Name, st, err)
				}
			}
			rules, err := carveRules(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(rules, "iptables-"+backend[h.Index]+": -A FORWARD -j CARVE-FORWARD") {
				t.Errorf("%s: carve's jump is not in the backend of the host's firewall (%s):\n%s", h.Name, backend[h.Index], rules)
			}
			if wg := "-A CARVE-FORWARD -i " + labcluster.WireGuardDevice(h) + " "; encryption != "" && !strings.Contains(rules, wg) {
				t.Errorf("%s: encryption on, but no rule for the WireGuard device (%s):\n%s", h.Name, wg, rules)
			}
		}
	})

	step("flushed rules are put back", func(t *testing.T) {
		ctx := within(t, converge)
		for _, h := range c.Hosts() {
			for _, args := range [][]string{{"-D", "FORWARD", "-j", "CARVE-FORWARD"}, {"-F", "CARVE-FORWARD"}} {
				if _, err := hostIptables(ctx, h, append([]string{"iptables-" + backend[h.Index], "-w"}, args...)...); err != nil {
					t.Fatal(err)
				}
			}
		}
		err := retry.Until(ctx, 200*time.Millisecond, func() error {
			return labcluster.Ping(ctx, containers).Err()
		})
		if err != nil {
			t.Fatalf("pings after the rules were flushed: %v\n%s", err, labcluster.Ping(ctx, containers))
		}
		for _, h := range c.Hosts() {
			sample := fmt.Sprintf(`carve_agent_forward_rules_installs_total{backend=%q,family="ipv4",reason="repair"}`, backend[h.Index])
			n, err := labcluster.MetricSample(ctx, c.HTTPClient(), h.AgentURL(), sample)
			if err != nil || n < 1 {
				t.Errorf("%s: %s = %v (%v), want at least 1", h.Name, sample, n, err)
			}
			log, err := os.ReadFile(h.Agent.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			line := grepLine(string(log), `msg="FORWARD accept rules were missing`)
			if !strings.Contains(line, "backend="+backend[h.Index]) {
				t.Errorf("%s's agent logged no repair in %s: %q", h.Name, backend[h.Index], line)
			}
			t.Logf("%s: %s", h.Name, line)
		}
	})

	step("a stopped agent removes its rules", func(t *testing.T) {
		ctx := within(t, converge)
		for _, h := range c.Hosts() {
			if err := c.StopAgent(ctx, h); err != nil {
				t.Fatal(err)
			}
			rules, err := carveRules(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			if rules != "" {
				t.Errorf("%s: the stopped agent left:\n%s", h.Name, rules)
			}
			// dockerd's own rules are not carve's to touch.
			out, err := hostIptables(ctx, h, "iptables-"+backend[h.Index]+"-save", "-t", "filter")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, ":FORWARD DROP") || !strings.Contains(out, "-A FORWARD -j DOCKER-USER") {
				t.Errorf("%s: the agent changed the host's own firewall:\n%s", h.Name, out)
			}
		}
	})
}
