package netnslab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-net/carve/test/lab/testutil"
)

func mustPing(t *testing.T, from *Namespace, to netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := from.PingRetry(ctx, to, 3); err != nil {
		t.Fatalf("ping %s from %s: %v", to, from.Name, err)
	}
}

func TestTopology(t *testing.T) {
	lab := ForTest(t, Options{Hosts: 3})
	hosts := lab.Hosts()
	if len(hosts) != 3 {
		t.Fatalf("hosts = %d, want 3", len(hosts))
	}
	for i, h := range hosts {
		want := netip.MustParsePrefix(fmt.Sprintf("198.18.0.%d/15", 11+i))
		if h.IP != want || h.Index != i+1 {
			t.Fatalf("host %d: ip %s index %d, want %s %d", i, h.IP, h.Index, want, i+1)
		}
		if _, err := os.Stat(filepath.Join(NetNSDir, h.Name)); err != nil {
			t.Fatalf("host namespace not mounted: %v", err)
		}
		if !strings.HasPrefix(h.Name, lab.Prefix()) {
			t.Fatalf("name %q lacks the lab prefix %q", h.Name, lab.Prefix())
		}
		// loopback is up in every namespace
		mustPing(t, h.Namespace, netip.MustParseAddr("127.0.0.1"))
	}
	mustPing(t, lab.Underlay, netip.MustParseAddr("127.0.0.1"))
	for _, a := range hosts {
		for _, b := range hosts {
			if a != b {
				mustPing(t, a.Namespace, b.IP.Addr())
			}
		}
	}
	// The underlay bridge carries one port per host.
	nh, err := lab.Underlay.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	br, err := nh.LinkByName(UnderlayBridge)
	if err != nil {
		t.Fatal(err)
	}
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	ports := 0
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports++
		}
	}
	if ports != 3 {
		t.Fatalf("underlay bridge has %d ports, want 3", ports)
	}
}

func TestContainers(t *testing.T) {
	lab := ForTest(t, Options{Hosts: 1})
	h := lab.Hosts()[0]
	gw := netip.MustParsePrefix("10.128.1.1/25")
	if err := h.AddBridge("m-test", gw, 1420); err != nil {
		t.Fatal(err)
	}
	gw6 := netip.MustParsePrefix("fd00:1::1/64")
	nh, err := h.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	br, err := nh.LinkByName("m-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(br, &netlink.Addr{IPNet: prefixToIPNet(gw6), Flags: nodad(gw6)}); err != nil {
		t.Fatal(err)
	}
	var cs []*Container
	for i := 2; i <= 3; i++ {
		c, err := lab.AddContainer(h, ContainerConfig{
			Bridge:   "m-test",
			Address:  netip.MustParsePrefix(fmt.Sprintf("10.128.1.%d/25", i)),
			Gateway:  gw.Addr(),
			Address6: netip.MustParsePrefix(fmt.Sprintf("fd00:1::%d/64", i)),
			Gateway6: gw6.Addr(),
		})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	ch, err := cs[0].Netlink()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ch.LinkByName(ContainerLink)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 1420 {
		t.Fatalf("container MTU %d, want the bridge's 1420", l.Attrs().MTU)
	}
	mustPing(t, cs[0].Namespace, gw.Addr())
	mustPing(t, cs[0].Namespace, cs[1].Config.Address.Addr())
	mustPing(t, cs[1].Namespace, cs[0].Config.Address.Addr())
	mustPing(t, cs[0].Namespace, cs[1].Config.Address6.Addr())
	mustPing(t, cs[1].Namespace, gw6.Addr())

	if _, err := lab.AddContainer(h, ContainerConfig{Bridge: "nope", Address: netip.MustParsePrefix("10.128.1.9/25")}); err == nil {
		t.Fatal("container on a missing bridge: want an error")
	}
}

// TestSysctlPerNamespace checks the assumption the dataplane relies on: a
// thread inside a namespace writes that namespace's /proc/sys/net, never the
// caller's.
func TestSysctlPerNamespace(t *testing.T) {
	lab := ForTest(t, Options{Hosts: 2})
	hosts := lab.Hosts()
	rootBefore, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	if err := hosts[0].SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if v, err := hosts[0].Sysctl("net.ipv4.ip_forward"); err != nil || v != "1" {
		t.Fatalf("ip_forward in host 1 = %q, %v; want 1", v, err)
	}
	if v, err := hosts[1].Sysctl("net.ipv4.ip_forward"); err != nil || v != "0" {
		t.Fatalf("ip_forward in host 2 = %q, %v; want 0 (untouched)", v, err)
	}
	rootAfter, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rootBefore, rootAfter) {
		t.Fatalf("root ip_forward changed from %q to %q", rootBefore, rootAfter)
	}
	if err := hosts[0].SetSysctl("kernel.hostname", "x"); err == nil {
		t.Fatal("a non-net sysctl must be refused")
	}
}

func TestStartProcess(t *testing.T) {
	lab := ForTest(t, Options{Hosts: 1})
	h := lab.Hosts()[0]
	cmd := exec.Command("sleep", "60")
	if err := h.Start(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	want, err := h.Inode()
	if err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if link != fmt.Sprintf("net:[%d]", want) {
		t.Fatalf("process in %s, want net:[%d]", link, want)
	}
	// Close kills what the lab started.
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the process's exit after Close", func() error {
		select {
		case <-done:
			return nil
		default:
			return errors.New("still running")
		}
	})
}

func TestIPNetnsExec(t *testing.T) {
	_, err := exec.LookPath("ip")
	testutil.Require(t, err == nil, "iproute2 (ip) not installed")
	lab := ForTest(t, Options{Hosts: 1})
	h := lab.Hosts()[0]
	args := h.ExecArgs("ip", "-o", "addr", "show", "dev", HostLink)
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	if !strings.Contains(string(out), h.IP.String()) {
		t.Fatalf("ip netns exec output lacks %s:\n%s", h.IP, out)
	}
	out, err = exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil || !strings.Contains(string(out), h.Name) {
		t.Fatalf("ip netns list does not show %s: %v\n%s", h.Name, err, out)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	testutil.Require(t, IsRoot(), "netnslab: needs root")
	lab, err := New(Options{Hosts: 2})
	if err != nil {
		t.Fatal(err)
	}
	h := lab.Hosts()[0]
	if err := h.AddBridge("b", netip.Prefix{}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := lab.AddContainer(h, ContainerConfig{Bridge: "b", Address: netip.MustParsePrefix("10.0.0.2/24")}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Netlink(); err != nil { // handed out, closed by the lab
		t.Fatal(err)
	}
	if n := countWithPrefix(t, lab.Prefix()); n != 4 {
		t.Fatalf("%d namespaces with the lab prefix, want 4", n)
	}
	// Concurrent closes (as from a signal handler and a defer) are fine.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = lab.Close() }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := countWithPrefix(t, lab.Prefix()); n != 0 {
		t.Fatalf("%d namespaces left after Close", n)
	}
	if err := h.Do(func() error { return nil }); err == nil {
		t.Fatal("Do after Close: want an error")
	}
	if _, err := lab.AddHost(); err == nil {
		t.Fatal("AddHost after Close: want an error")
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentLabs(t *testing.T) {
	testutil.Require(t, IsRoot(), "netnslab: needs root")
	var wg sync.WaitGroup
	labs := make([]*Lab, 3)
	errs := make([]error, len(labs))
	for i := range labs {
		wg.Go(func() { labs[i], errs[i] = New(Options{Hosts: 2}) })
	}
	wg.Wait()
	for _, l := range labs {
		if l != nil {
			t.Cleanup(func() {
				if err := l.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range labs {
		if seen[l.Prefix()] {
			t.Fatalf("two labs share the prefix %q", l.Prefix())
		}
		seen[l.Prefix()] = true
		hs := l.Hosts()
		mustPing(t, hs[0].Namespace, hs[1].IP.Addr())
	}
}

func TestRemoveStale(t *testing.T) {
	testutil.Require(t, IsRoot(), "netnslab: needs root")
	// A creator killed but not reaped yet is a zombie: gone all the same.
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zombie.Wait() })
	testutil.Eventually(t, 0, "the exited child becomes a zombie", testutil.True(func() bool { return !PIDAlive(zombie.Process.Pid) }))
	// pid_max is at most 4194304, so this creator cannot be running.
	dead := filepath.Join(NetNSDir, "carvelabstale-99999999-1-h1")
	ofZombie := filepath.Join(NetNSDir, fmt.Sprintf("carvelabstale-%d-1-h1", zombie.Process.Pid))
	alive := filepath.Join(NetNSDir, fmt.Sprintf("carvelabstale-%d-1-h1", os.Getpid()))
	other := filepath.Join(NetNSDir, "carvelabstale-notapid")
	for _, p := range []string{dead, ofZombie, alive, other} {
		if err := createNamed(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = RemoveMount(p) })
	}
	removed, err := RemoveStale("carvelabstale")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Base(dead), filepath.Base(ofZombie)}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for p, want := range map[string]bool{dead: false, ofZombie: false, alive: true, other: true} {
		_, err := os.Stat(p)
		if (err == nil) != want {
			t.Fatalf("%s exists=%v, want %v", p, err == nil, want)
		}
	}
}

func countWithPrefix(t *testing.T, prefix string) int {
	t.Helper()
	entries, err := os.ReadDir(NetNSDir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			n++
		}
	}
	return n
}

// TestPingErrors: Ping and PingEchoes fail at once, with the reason, where
// the kernel refuses the echo; they never wait for a reply to be absent.
func TestPingErrors(t *testing.T) {
	lab := ForTest(t, Options{})
	bare, err := lab.AddNamespace("bare") // only lo: no route anywhere else
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	tests := []struct {
		name string
		ctx  context.Context
		dst  netip.Addr
		want error  // errors.Is, when set
		msg  string // in the error
	}{
		{"invalid address", context.Background(), netip.Addr{}, nil, "invalid address"},
		{"no route", context.Background(), netip.MustParseAddr("198.18.99.99"), unix.ENETUNREACH, "198.18.99.99"},
		{"cancelled", cancelled, netip.MustParseAddr("127.0.0.1"), context.Canceled, "127.0.0.1"},
		// Its deadline passed before the echo left (a stalled pinger): not
		// a lost echo, which PingWatch would count as the path's loss.
		{"deadline passed before sending", expired, netip.MustParseAddr("127.0.0.1"), ErrNotSent, "before the echo request was sent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := bare.Ping(tc.ctx, tc.dst)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Ping = %v; want an error (%v) naming %q", err, tc.want, tc.msg)
			}
		})
	}

	// PingEchoes sends exactly its attempts when each fails, and stops at
	// the first reply, with its round trip.
	sent, rtt, err := bare.PingEchoes(context.Background(), netip.MustParseAddr("198.18.99.99"), 3)
	if !errors.Is(err, unix.ENETUNREACH) || sent != 3 || rtt != 0 {
		t.Fatalf("PingEchoes without a route = %d sent, rtt %s, %v; want 3 sent, 0, ENETUNREACH", sent, rtt, err)
	}
	sent, rtt, err = bare.PingEchoes(context.Background(), netip.MustParseAddr("127.0.0.1"), 3)
	if err != nil || sent != 1 || rtt <= 0 {
		t.Fatalf("PingEchoes to loopback = %d sent, rtt %s, %v; want 1 sent, a round trip, nil", sent, rtt, err)
	}
}

// TestRemoveMountBusyFile: a namespace file that is still a mount point
// after one unmount (bound twice) is removed, not left behind with EBUSY.
func TestRemoveMountBusyFile(t *testing.T) {
	testutil.Require(t, IsRoot(), "netnslab: needs root")
	p := filepath.Join(NetNSDir, fmt.Sprintf("carvelabbusy-%d-1-h1", os.Getpid()))
	if err := createNamed(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = RemoveMount(p) })
	if err := unix.Mount("/proc/self/ns/net", p, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	// What RemoveMount did before: one unmount, one remove.
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("removing the file bound twice after one unmount: %v, want EBUSY (the test proves nothing)", err)
	}
	if err := RemoveMount(p); err != nil {
		t.Fatalf("RemoveMount: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the namespace file is still there: %v", err)
	}
}
