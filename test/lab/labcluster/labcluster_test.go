package labcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/proclab"
	"github.com/carve-net/carve/test/lab/testutil"
	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
)

const testPrefix = "carvelabtest"

func TestMain(m *testing.M) { os.Exit(RunTests(m, testPrefix)) }

func deadline(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestMasters runs the masters alone (no agent): they elect a leader inside
// the host namespaces, answer the harness through the underlay, survive the
// leader's SIGKILL, and a killed master comes back from its data dir.
func TestMasters(t *testing.T) {
	c := ForTest(t, Options{Hosts: 3, Prefix: testPrefix})
	ctx := deadline(t, 60*time.Second)
	if err := c.StartMasters(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Masters() {
		if m.PID() == 0 || !m.Running() {
			t.Fatalf("%s not running", m.ID)
		}
		// Each master runs in its host's namespace.
		ino, err := m.Host.NS.Inode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := nsInodeOf(m.PID())
		if err != nil {
			t.Fatal(err)
		}
		if got != ino {
			t.Fatalf("%s runs in namespace %d, want its host's %d", m.ID, got, ino)
		}
	}
	info, err := c.Client().Register(ctx, api.RegisterRequest{AgentID: "fake", IP: "198.18.3.1",
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}})
	if err != nil {
		t.Fatal(err)
	}
	if ov := info.Overlay("carve"); ov == nil || ov.Subnet == "" {
		t.Fatalf("registration without a carve lease: %+v", info)
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.KillMaster(leader); err != nil {
		t.Fatal(err)
	}
	if leader.Running() {
		t.Fatalf("%s still running after SIGKILL", leader.ID)
	}
	next, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("leader %s is dead but still reported", leader.ID)
	}
	if err := c.StartMaster(leader); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the restarted "+leader.ID+" serves the lease", func() error {
		cl, err := apiclient.NewClient([]string{leader.URL()}, c.HTTPClient())
		if err != nil {
			return err
		}
		a, err := cl.Agent(ctx, "fake")
		if err != nil {
			return err
		}
		if a.IP != "198.18.3.1" {
			return fmt.Errorf("ip %q", a.IP)
		}
		return nil
	})
	if err := c.StopMaster(ctx, leader); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(proclab.TailFile(leader.LogPath, 1000), "=== ") {
		t.Fatalf("log %s lacks the start/exit markers", leader.LogPath)
	}
}

func nsInodeOf(pid int) (uint64, error) {
	id, err := statNS(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"))
	return id.ino, err
}

// TestKernelAndPing programs two hosts with the vxlan dataplane directly, as
// agents would, and checks what ReadKernel, HasPeer, LacksPeer and the ping
// matrix make of it.
func TestKernelAndPing(t *testing.T) {
	c := ForTest(t, Options{Hosts: 2, Masters: 1, Prefix: testPrefix})
	ctx := deadline(t, 30*time.Second)
	hosts := c.Hosts()
	type agent struct {
		info api.AgentInfo
		pe   PeerEntries
	}
	var agents []agent
	for i, h := range hosts {
		n := i + 1
		info := api.AgentInfo{AgentID: fmt.Sprintf("a%d", n), IP: h.IP().Addr().String(), Overlays: []api.AgentOverlay{{
			Info:        api.OverlayNetwork{Name: "carve"},
			Subnet:      fmt.Sprintf("10.128.%d.0/24", n),
			MesosBridge: &api.BridgeInfo{Name: "m-carve", IP: fmt.Sprintf("10.128.%d.0/25", n)},
			Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VNI: 1024, VTEPName: "vtep1024",
				VTEPIP: fmt.Sprintf("100.64.0.%d/16", n), VTEPMAC: fmt.Sprintf("70:b3:d5:40:00:%02x", n), VTEPPort: 4789, VTEPMTU: 1450}},
			State: api.OverlayState{Status: api.StatusOK},
		}}}
		pe, err := EntriesOf(info)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, agent{info, pe})
	}
	for i, h := range hosts {
		self := agents[i].pe
		mac, _ := net.ParseMAC(self.VTEPMAC)
		want := vxlan.Desired{
			VTEP: vxlan.VTEP{Name: "vtep1024", VNI: 1024, Port: 4789, Local: h.IP().Addr(), MAC: mac, MTU: 1450,
				Address: netip.PrefixFrom(self.VTEPIP, 16)},
			Bridges:   []vxlan.Bridge{{Name: "m-carve", Gateway: netip.MustParsePrefix(fmt.Sprintf("10.128.%d.1/25", i+1)), MTU: 1420}},
			IPForward: true,
		}
		for j, o := range agents {
			if j == i {
				continue
			}
			omac, _ := net.ParseMAC(o.pe.VTEPMAC)
			want.Peers = append(want.Peers, vxlan.Peer{ID: o.pe.AgentID, UnderlayIP: o.pe.UnderlayIP, VTEPIP: o.pe.VTEPIP,
				VTEPMAC: omac, Subnets: o.pe.Subnets})
		}
		dp, err := vxlan.New(vxlan.Options{NetNS: h.NS.NsHandle()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dp.Apply(ctx, want); err != nil {
			t.Fatal(err)
		}
		dp.Close()
	}
	for i, h := range hosts {
		ks, err := c.Kernel(h)
		if err != nil {
			t.Fatal(err)
		}
		if ks.VTEP == nil || ks.VTEP.Local != h.IP().Addr() || ks.VTEP.VNI != 1024 || !ks.VTEP.Up {
			t.Fatalf("%s VTEP: %+v", h.Name, ks.VTEP)
		}
		other := agents[1-i].pe
		if err := ks.HasPeer(other); err != nil {
			t.Fatalf("%s: %v\n%s", h.Name, err, ks)
		}
		if err := ks.LacksPeer(other); err == nil {
			t.Fatalf("%s: LacksPeer(%s) = nil while programmed", h.Name, other.AgentID)
		}
		if err := ks.HasPeer(agents[i].pe); err == nil {
			t.Fatalf("%s: HasPeer(itself) = nil", h.Name)
		}
		if err := ks.LacksPeer(agents[i].pe); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}

	// Containers on the bridges, by hand: no agent runs here to serve CNI.
	var cs []*Container
	for i, h := range hosts {
		for k := 2; k <= 3; k++ {
			addr := netip.MustParsePrefix(fmt.Sprintf("10.128.%d.%d/25", i+1, k))
			gw := netip.MustParseAddr(fmt.Sprintf("10.128.%d.1", i+1))
			nc, err := c.Lab.AddContainer(h.NS, netnslab.ContainerConfig{Bridge: "m-carve", Address: addr, Gateway: gw})
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, &Container{NS: nc, Host: h, Overlay: "carve", Addr: addr, Gateway: gw,
				Name: strings.TrimPrefix(nc.Name, c.Lab.Prefix())})
		}
	}
	m := Ping(ctx, cs)
	if err := m.Err(); err != nil {
		t.Fatalf("%v\n%s", err, m)
	}
	if m.Pairs() != 8 {
		t.Fatalf("pairs = %d, want 8 (2x2 containers, both ways)\n%s", m.Pairs(), m)
	}
	table := m.String()
	if !strings.Contains(table, "8 pairs pinged across hosts, 0 failed") || !strings.Contains(table, cs[0].Label()) {
		t.Fatalf("table:\n%s", table)
	}

	// Host 2 loses its peer: the kernel no longer holds host 1's entries.
	dp, err := vxlan.New(vxlan.Options{NetNS: hosts[1].NS.NsHandle()})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	ks, err := c.Kernel(hosts[1])
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(ks.VTEP.MAC)
	_, err = dp.Resync(ctx, vxlan.Desired{VTEP: vxlan.VTEP{Name: "vtep1024", VNI: 1024, Port: 4789, Local: hosts[1].IP().Addr(),
		MAC: mac, MTU: 1450, Address: ks.VTEP.Addrs[0]},
		Bridges: []vxlan.Bridge{{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.2.1/25"), MTU: 1420}}})
	if err != nil {
		t.Fatal(err)
	}
	ks, err = c.Kernel(hosts[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.LacksPeer(agents[0].pe); err != nil {
		t.Fatal(err)
	}
	if err := ks.HasPeer(agents[0].pe); err == nil {
		t.Fatalf("HasPeer = nil after the peer was removed:\n%s", ks)
	}
}

// TestPingMatrixReport renders a matrix with a failed pair: the table marks
// it FAIL, the count and Err name it, skipped cells are dots.
func TestPingMatrixReport(t *testing.T) {
	h1, h2 := &Host{Name: "h1"}, &Host{Name: "h2"}
	cs := []*Container{
		{Name: "a", Host: h1, Addr: netip.MustParsePrefix("10.128.1.2/25")},
		{Name: "b", Host: h2, Addr: netip.MustParsePrefix("10.128.2.2/25")},
	}
	lost := errors.New("no reply")
	m := &PingMatrix{Containers: cs, Results: [][]PingResult{
		{{Skipped: true}, {RTT: 1500 * time.Microsecond, Attempts: 1}},
		{{Err: lost, Attempts: PingAttempts}, {Skipped: true}},
	}}
	if m.OK() || m.Pairs() != 2 {
		t.Fatalf("OK %v, pairs %d; want false, 2", m.OK(), m.Pairs())
	}
	if err := m.Err(); !errors.Is(err, lost) || !strings.Contains(err.Error(), "1 of 2 pings failed") || !strings.Contains(err.Error(), "b 10.128.2.2 -> a 10.128.1.2") {
		t.Fatalf("Err = %v", err)
	}
	want := strings.Join([]string{
		`from \ to     a 10.128.1.2  b 10.128.2.2`,
		`a 10.128.1.2  .             ok 1.50ms`,
		`b 10.128.2.2  FAIL          .`,
		`2 pairs pinged across hosts, 1 failed`,
	}, "\n") + "\n"
	if got := m.String(); got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
}

// TestSetUnderlayIP re-addresses an agent-only host: the others reach the new
// address, not the old one; a master's host is refused.
func TestSetUnderlayIP(t *testing.T) {
	c := ForTest(t, Options{Hosts: 3, Masters: 1, Prefix: testPrefix})
	ctx := deadline(t, 20*time.Second)
	h1, h3 := c.Host(1), c.Host(3)
	old := h3.IP()
	if err := c.SetUnderlayIP(h1, netip.MustParsePrefix("198.18.1.11/15")); err == nil {
		t.Fatal("re-addressing the master's host: want an error")
	}
	if err := c.SetUnderlayIP(h3, netip.MustParsePrefix("10.0.0.1/15")); err == nil {
		t.Fatal("an address outside 198.18.0.0/15: want an error")
	}
	nw := netip.MustParsePrefix("198.18.1.13/15")
	if err := c.SetUnderlayIP(h3, nw); err != nil {
		t.Fatal(err)
	}
	if h3.IP() != nw {
		t.Fatalf("IP() = %s, want %s", h3.IP(), nw)
	}
	// The kernel holds the new address on the underlay link, not the old.
	nh, err := h3.NS.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	link, err := nh.LinkByName(h3.NS.Link)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := nh.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		got = append(got, netip.PrefixFrom(addrOf(a.IP), ones))
	}
	if !slices.Equal(got, []netip.Prefix{nw}) {
		t.Fatalf("%s on %s: %v, want only %s (not the old %s)", h3.NS.Link, h3.Name, got, nw, old)
	}
	// And the others reach it there.
	if err := h1.NS.PingRetry(ctx, nw.Addr(), 3); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveStale leaves a carve master running in a namespace named like a
// cluster's whose creator is a zombie (killed, not reaped yet), and an empty
// one whose creator is gone, and checks that RemoveStale kills the master and
// removes both namespaces, and leaves a live run's namespace alone.
func TestRemoveStale(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root")
	bin := os.Getenv(BinaryEnv)
	prefix := "carvestaletest"
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zombie.Wait() })
	testutil.Eventually(t, 0, "the exited child becomes a zombie", testutil.True(func() bool { return !netnslab.PIDAlive(zombie.Process.Pid) }))
	withMaster := fmt.Sprintf("%s-%d-1-h1", prefix, zombie.Process.Pid)
	empty := fmt.Sprintf("%s-%d-1-u", prefix, deadPID(t))
	for _, name := range []string{withMaster, empty} {
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	}
	if out, err := exec.Command("ip", "-n", withMaster, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
	dir := t.TempDir()
	cmd := exec.Command("ip", "netns", "exec", withMaster, bin, "master", "--id", "m1", "--data-dir", filepath.Join(dir, "m1"),
		"--http-addr", "127.0.0.1:8080", "--raft-addr", "127.0.0.1:8300", "--peers", "m1=127.0.0.1:8300", "--insecure")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	// A live cluster with the same prefix must survive.
	live := ForTest(t, Options{Hosts: 1, Masters: 1, Prefix: prefix})

	// Wait until `ip netns exec` has become carve.
	testutil.Eventually(t, 0, "ip netns exec becomes carve master", func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		if err != nil {
			return err
		}
		if !isClusterProcess(b) {
			return fmt.Errorf("cmdline %q", b)
		}
		return nil
	})
	killed, removed, err := RemoveStale(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) != 1 || killed[0] != cmd.Process.Pid {
		t.Fatalf("killed %v, want [%d]", killed, cmd.Process.Pid)
	}
	want := []string{withMaster, empty}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	testutil.Eventually(t, 0, "the stale master's exit", func() error {
		select {
		case <-done:
			return nil
		default:
			return errors.New("the stale master still runs")
		}
	})
	if _, err := os.Stat(live.Host(1).NS.Path); err != nil {
		t.Fatalf("the live cluster's namespace is gone: %v", err)
	}
}

func deadPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	for pid := max - 1; pid > max-1000; pid-- {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return pid
		}
	}
	t.Fatal("no free pid")
	return 0
}

func TestIsClusterProcess(t *testing.T) {
	for in, want := range map[string]bool{
		"/tmp/x/carve\x00agent\x00--data-dir\x00d\x00": true,
		"./bin/carve\x00master\x00--id\x00m1\x00":      true,
		"carve\x00state\x00":                           false,
		"/usr/bin/carvex\x00agent\x00":                 false,
		"bash\x00carve\x00agent\x00":                   false,
		"":                                             false,
	} {
		if got := isClusterProcess([]byte(in)); got != want {
			t.Errorf("isClusterProcess(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestCluster runs real agents: the harness starts them, sees them converge,
// finds every agent's entries in the other hosts' kernels, and attaches
// containers through CNI (the agent's conflist, the bridge plugin,
// carve-ipam), which then ping across hosts, and detaches them with DEL and GC.
func TestCluster(t *testing.T) {
	c := ForTest(t, Options{Hosts: 2, Masters: 1, Prefix: testPrefix})
	ctx := deadline(t, 90*time.Second)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Agents) != 2 {
		t.Fatalf("%d agents at the masters, want 2", len(st.Agents))
	}
	checkSecure(ctx, t, c)
	for _, h := range c.Hosts() {
		if h.AgentID() != h.CertName() {
			t.Fatalf("%s: agent id %q, want its certificate's %q", h.Name, h.AgentID(), h.CertName())
		}
		ks, err := c.Kernel(h)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range st.Agents {
			pe, err := EntriesOf(a)
			if err != nil {
				t.Fatal(err)
			}
			if a.AgentID == h.AgentID() {
				if ks.VTEP == nil || ks.VTEP.MAC != pe.VTEPMAC {
					t.Fatalf("%s: VTEP %+v, want MAC %s", h.Name, ks.VTEP, pe.VTEPMAC)
				}
				continue
			}
			if err := ks.HasPeer(pe); err != nil {
				t.Fatalf("%s: %v", h.Name, err)
			}
		}
		for range 2 {
			if _, err := c.AddCNIContainer(ctx, h, "carve", CNIOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cs := c.Containers()
	if len(cs) != 4 {
		t.Fatalf("%d containers attached, want 4", len(cs))
	}
	// The agent's IPAM hands out the lowest free addresses after the gateway.
	if cs[0].Addr.Addr().Next() != cs[1].Addr.Addr() || cs[0].Gateway.Next() != cs[0].Addr.Addr() {
		t.Fatalf("container addresses %s %s gateway %s: want gateway+1, gateway+2", cs[0].Addr, cs[1].Addr, cs[0].Gateway)
	}
	for _, ct := range cs {
		if ct.NS.HostLink == "" || ct.Result == nil || ct.ContainerID != ct.Name || ct.IfName != DefaultIfName {
			t.Fatalf("%s: host link %q, result %v, attachment %s/%s", ct.Name, ct.NS.HostLink, ct.Result, ct.ContainerID, ct.IfName)
		}
		if err := c.CheckCNIContainer(ctx, ct); err != nil {
			t.Fatal(err)
		}
	}
	if m := c.PingAll(ctx); !m.OK() {
		t.Fatalf("%v\n%s", m.Err(), m)
	}

	// DEL detaches (and may be repeated); GC through the conflist DELs what
	// the valid list leaves out.
	h1 := c.Host(1)
	if err := c.DelCNIContainer(ctx, cs[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.DelCNIContainer(ctx, cs[0]); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
	if got := c.AttachedOn(h1, "carve"); len(got) != 1 || got[0] != cs[1] {
		t.Fatalf("attached on h1 after DEL: %v", got)
	}
	if err := c.GCNetwork(ctx, h1, "carve", nil); err != nil {
		t.Fatal(err)
	}
	list, err := c.IPAMClient(h1).List(ctx, "carve")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Allocations) != 0 {
		t.Fatalf("h1's agent holds %v after a GC with no valid attachment", list.Allocations)
	}
}

// checkSecure checks that the cluster runs secure: every agent with its
// certificate, the mesh password and the masters' verification key, its API over TLS refusing a client
// without a certificate (but for /healthz), and the masters with TLS when
// the binary has it.
func checkSecure(ctx context.Context, t *testing.T, c *Cluster) {
	t.Helper()
	for _, h := range c.Hosts() {
		args := h.Agent.Args()
		for _, f := range []string{"--ca-file", "--cert-file", "--key-file", "--mesh-password-file", "--signing-pub-file"} {
			if !slices.Contains(args, f) {
				t.Errorf("agent on %s runs without %s: %v", h.Name, f, args)
			}
		}
	}
	noCert := newHTTPClient(c.Lab.Underlay, &tls.Config{RootCAs: mustPool(t, c.OperatorFiles())})
	t.Cleanup(noCert.CloseIdleConnections)
	for path, want := range map[string]int{"/healthz": 200, "/overlay-agent/peers": 401, "/metrics": 401} {
		err := api.Call(ctx, noCert, "GET", c.Host(1).AgentURL()+path, nil, nil, nil)
		var apiErr *api.Error
		switch {
		case want == 200 && err != nil:
			t.Errorf("GET %s without a client certificate: %v", path, err)
		case want != 200 && (!errors.As(err, &apiErr) || apiErr.Status != want):
			t.Errorf("GET %s without a client certificate: %v, want %d", path, err, want)
		}
	}
	if !strings.HasPrefix(c.MasterURLs()[0], "https://") {
		t.Errorf("masters with TLS at %v", c.MasterURLs())
	}
}

func mustPool(t *testing.T, f pki.Files) *x509.CertPool {
	t.Helper()
	pool, err := f.Pool()
	if err != nil {
		t.Fatal(err)
	}
	return pool
}
