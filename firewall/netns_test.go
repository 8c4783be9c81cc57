package firewall_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/firewall"
	"github.com/carve-net/carve/test/lab/netnslab"
	labtest "github.com/carve-net/carve/test/lab/testutil"
)

// Every test here changes the firewall of namespaces it creates only: each
// iptables command runs inside the test's namespace (ip netns exec), and
// the code under test is given that namespace (Options.NetNS).

// ipt runs an iptables binary (iptables-nft, ip6tables-legacy, ...) inside ns.
func ipt(t *testing.T, ns *netnslab.Namespace, args ...string) string {
	t.Helper()
	argv := ns.ExecArgs(args...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(args, " "), ns.Name, err, out)
	}
	return string(out)
}

// needIptables skips (fails under CI) without root or without both backends.
func needIptables(t *testing.T) {
	t.Helper()
	labtest.Require(t, netnslab.IsRoot(), "needs root to create network namespaces")
	for _, b := range []string{"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"} {
		_, err := exec.LookPath(b)
		if err != nil {
			_, err = exec.LookPath("/usr/sbin/" + b)
		}
		labtest.Require(t, err == nil, "needs %s (Debian: apt-get install iptables; deploy/install-deps.sh installs it)", b)
	}
}

// newForward is a Forward of a fresh namespace, with its metrics.
func newForward(t *testing.T) (*firewall.Forward, *netnslab.Lab, *netnslab.Host, *prometheus.Registry) {
	t.Helper()
	needIptables(t)
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1, Prefix: "carvefw"})
	h := lab.Hosts()[0]
	reg := prometheus.NewRegistry()
	f, err := firewall.New(firewall.Options{NetNS: h.NsHandle(), Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, lab, h, reg
}

// save is the filter table of one backend of one family in ns.
func save(t *testing.T, ns *netnslab.Namespace, prog string, backend firewall.Backend) string {
	t.Helper()
	return ipt(t, ns, prog+"-"+string(backend)+"-save", "-t", "filter")
}

// forwardRules are the rules of FORWARD in order, as -S prints them.
func forwardRules(t *testing.T, ns *netnslab.Namespace, prog string, backend firewall.Backend) []string {
	t.Helper()
	var rules []string
	for _, l := range strings.Split(ipt(t, ns, prog+"-"+string(backend), "-w", "-S", "FORWARD"), "\n") {
		if strings.HasPrefix(l, "-A ") {
			rules = append(rules, l)
		}
	}
	return rules
}

func installs(reg *prometheus.Registry, fam firewall.Family, b firewall.Backend, reason string) int {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "carve_agent_forward_rules_installs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["family"] == string(fam) && labels["backend"] == string(b) && labels["reason"] == reason {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}

// checkKept fails unless the backend holds exactly carve's rules for
// devices, jumped to first in FORWARD, and the other backend nothing of
// carve's.
func checkKept(t *testing.T, ns *netnslab.Namespace, prog string, b, other firewall.Backend, devices ...string) {
	t.Helper()
	got := save(t, ns, prog, b)
	for _, d := range devices {
		for _, r := range []string{"-A CARVE-FORWARD -i " + d + " -j CARVE-FORWARD-OUT", "-A CARVE-FORWARD-OUT -o " + d + " -j ACCEPT"} {
			if !strings.Contains(got, r+"\n") {
				t.Errorf("%s-%s lacks %q:\n%s", prog, b, r, got)
			}
		}
	}
	if n := strings.Count(got, "-A CARVE-FORWARD "); n != len(devices) {
		t.Errorf("%s-%s holds %d rules in CARVE-FORWARD, want %d:\n%s", prog, b, n, len(devices), got)
	}
	if fw := forwardRules(t, ns, prog, b); len(fw) == 0 || fw[0] != "-A FORWARD -j CARVE-FORWARD" || strings.Count(strings.Join(fw, "\n"), "CARVE-FORWARD") != 1 {
		t.Errorf("%s-%s FORWARD %q: want one jump to CARVE-FORWARD, first", prog, b, fw)
	}
	if s := save(t, ns, prog, other); strings.Contains(s, "CARVE") {
		t.Errorf("%s-%s holds carve's rules too:\n%s", prog, other, s)
	}
}

// checkGone fails when any backend of either family holds anything of carve's.
func checkGone(t *testing.T, ns *netnslab.Namespace) {
	t.Helper()
	for _, prog := range []string{"iptables", "ip6tables"} {
		for _, b := range []firewall.Backend{firewall.NFT, firewall.Legacy} {
			if s := save(t, ns, prog, b); strings.Contains(s, "CARVE") {
				t.Errorf("%s-%s still holds carve's rules:\n%s", prog, b, s)
			}
		}
	}
}

// The rules go where the host's FORWARD policy is (dockerd's DROP, in
// either backend), first in FORWARD; they are checked without a write,
// repaired after a flush or a rule inserted above them, follow the devices,
// and Remove takes out everything, in both families.
func TestEnsureKeepsRules(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backend  firewall.Backend // where dockerd's policy is
		other    firewall.Backend
		setup    bool // set FORWARD DROP before the first Ensure
		expected firewall.Backend
	}{
		{"dockerd on nft", firewall.NFT, firewall.Legacy, true, firewall.NFT},
		{"dockerd on legacy", firewall.Legacy, firewall.NFT, true, firewall.Legacy},
		{"no firewall: nft", firewall.NFT, firewall.Legacy, false, firewall.NFT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, h, reg := newForward(t)
			ns := h.Namespace
			ctx := context.Background()
			if tc.setup {
				for _, prog := range []string{"iptables", "ip6tables"} {
					ipt(t, ns, prog+"-"+string(tc.backend), "-w", "-P", "FORWARD", "DROP")
				}
			}
			rules := firewall.Rules{Devices: []string{"vtep1024", "m-carve"}, IPv6: true}
			if err := f.Ensure(ctx, rules); err != nil {
				t.Fatal(err)
			}
			for _, prog := range []string{"iptables", "ip6tables"} {
				checkKept(t, ns, prog, tc.expected, tc.other, "vtep1024", "m-carve")
			}
			if n := installs(reg, firewall.IPv4, tc.expected, "install"); n != 1 {
				t.Errorf("installs after the first Ensure: %d, want 1", n)
			}

			// In sync: nothing written.
			if err := f.Ensure(ctx, rules); err != nil {
				t.Fatal(err)
			}
			if n := installs(reg, firewall.IPv4, tc.expected, "install") + installs(reg, firewall.IPv4, tc.expected, "repair"); n != 1 {
				t.Errorf("writes after an Ensure in sync: %d, want still 1", n)
			}

			// Flushed, and a rule inserted above the jump (a dockerd
			// restart): both repaired.
			ipt(t, ns, "iptables-"+string(tc.expected), "-w", "-F", "CARVE-FORWARD")
			ipt(t, ns, "ip6tables-"+string(tc.expected), "-w", "-I", "FORWARD", "1", "-o", "docker0", "-j", "DROP")
			if err := f.Ensure(ctx, rules); err != nil {
				t.Fatal(err)
			}
			for _, prog := range []string{"iptables", "ip6tables"} {
				checkKept(t, ns, prog, tc.expected, tc.other, "vtep1024", "m-carve")
			}
			for _, fam := range []firewall.Family{firewall.IPv4, firewall.IPv6} {
				if n := installs(reg, fam, tc.expected, "repair"); n != 1 {
					t.Errorf("%s repairs: %d, want 1", fam, n)
				}
			}
			if !strings.Contains(strings.Join(forwardRules(t, ns, "ip6tables", tc.expected), "\n"), "-o docker0 -j DROP") {
				t.Error("the rule inserted above carve's jump was removed; it is not carve's")
			}

			// A new bridge.
			rules.Devices = append(rules.Devices, "d-carve")
			if err := f.Ensure(ctx, rules); err != nil {
				t.Fatal(err)
			}
			checkKept(t, ns, "iptables", tc.expected, tc.other, "vtep1024", "m-carve", "d-carve")

			if err := f.Remove(ctx); err != nil {
				t.Fatal(err)
			}
			checkGone(t, ns)
			if err := f.Remove(ctx); err != nil {
				t.Fatalf("Remove with nothing left: %v", err)
			}
		})
	}
}

// A host whose firewall moves to the other backend (dockerd started on
// legacy after the agent kept its rules in nft) gets the rules there, and
// carve's chains leave the backend it no longer uses.
func TestEnsureFollowsTheBackend(t *testing.T) {
	f, _, h, _ := newForward(t)
	ns := h.Namespace
	ctx := context.Background()
	rules := firewall.Rules{Devices: []string{"vtep1024", "m-carve"}}
	if err := f.Ensure(ctx, rules); err != nil {
		t.Fatal(err)
	}
	checkKept(t, ns, "iptables", firewall.NFT, firewall.Legacy, "vtep1024", "m-carve")
	ipt(t, ns, "iptables-legacy", "-w", "-P", "FORWARD", "DROP")
	if err := f.Ensure(ctx, rules); err != nil {
		t.Fatal(err)
	}
	checkKept(t, ns, "iptables", firewall.Legacy, firewall.NFT, "vtep1024", "m-carve")
}

// What the rules are for: with FORWARD's policy DROP, packets between
// carve's bridges pass once Ensure ran, packets to a bridge that is not
// carve's stay dropped, and after Remove the policy drops them all again.
func TestForwardingThroughDrop(t *testing.T) {
	for _, b := range []firewall.Backend{firewall.NFT, firewall.Legacy} {
		t.Run(string(b), func(t *testing.T) {
			f, lab, h, _ := newForward(t)
			if err := h.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
				t.Fatal(err)
			}
			var cs []*netnslab.Container
			for i, br := range []string{"m-a", "m-b", "other"} {
				gw := netip.MustParsePrefix(fmt.Sprintf("10.%d.0.1/24", 128+i))
				if err := h.AddBridge(br, gw, 1500); err != nil {
					t.Fatal(err)
				}
				c, err := lab.AddContainer(h, netnslab.ContainerConfig{Bridge: br, Address: netip.MustParsePrefix(fmt.Sprintf("10.%d.0.2/24", 128+i)), Gateway: gw.Addr()})
				if err != nil {
					t.Fatal(err)
				}
				cs = append(cs, c)
			}
			a, bb, other := cs[0], cs[1], cs[2]
			reach := func(from, to *netnslab.Container) error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return from.PingRetry(ctx, to.Config.Address.Addr(), 3)
			}
			dropped := func(from, to *netnslab.Container) error {
				ctx, cancel := context.WithTimeout(context.Background(), netnslab.DefaultPingTimeout)
				defer cancel()
				if err := from.Ping(ctx, to.Config.Address.Addr()); err == nil {
					return fmt.Errorf("%s reached %s through FORWARD DROP", from.Name, to.Config.Address)
				}
				return nil
			}
			if err := reach(a, bb); err != nil {
				t.Fatalf("before any firewall: %v", err)
			}
			ipt(t, h.Namespace, "iptables-"+string(b), "-w", "-P", "FORWARD", "DROP")
			if err := dropped(a, bb); err != nil {
				t.Fatal(err)
			}
			if err := f.Ensure(context.Background(), firewall.Rules{Devices: []string{"m-a", "m-b"}}); err != nil {
				t.Fatal(err)
			}
			if err := reach(a, bb); err != nil {
				t.Fatalf("with carve's rules: %v", err)
			}
			if err := reach(bb, a); err != nil {
				t.Fatalf("with carve's rules: %v", err)
			}
			if err := dropped(a, other); err != nil {
				t.Fatalf("to a bridge that is not carve's: %v", err)
			}
			if err := f.Remove(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := dropped(a, bb); err != nil {
				t.Fatalf("after Remove: %v", err)
			}
		})
	}
}

// A backend that cannot be read (a kernel without x_tables: its -save
// fails) holds nobody's rules: the rules go into the other, without an
// error. With no backend readable, Ensure fails naming them.
func TestUnreadableBackend(t *testing.T) {
	needIptables(t)
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1, Prefix: "carvefw"})
	h := lab.Hosts()[0]
	for _, tc := range []struct {
		name     string
		broken   []string // backends whose binaries fail
		wantErr  bool
		wantKept firewall.Backend
	}{
		{"legacy unreadable", []string{"legacy"}, false, firewall.NFT},
		{"nothing readable", []string{"legacy", "nft"}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			look := func(name string) (string, error) {
				for _, b := range tc.broken {
					if strings.Contains(name, "-"+b+"-") {
						return exec.LookPath("false")
					}
				}
				return exec.LookPath(name)
			}
			f, err := firewall.New(firewall.Options{NetNS: h.NsHandle(), LookPath: look, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			err = f.Ensure(context.Background(), firewall.Rules{Devices: []string{"m-carve"}})
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "read the ipv4 rules (nft)") || !strings.Contains(err.Error(), "read the ipv4 rules (legacy)") {
					t.Fatalf("Ensure with no readable backend: %v, want an error naming both", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkKept(t, h.Namespace, "iptables", tc.wantKept, firewall.Legacy, "m-carve")
			if err := f.Remove(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
