package vxlan_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
	"github.com/carve-net/carve/vxlan"
)

// routedPair is two hosts in routed mode with a container each.
type routedPair struct {
	envs    [2]*env
	cs      [2]*netnslab.Container
	desired [2]vxlan.Desired
	reps    [2]vxlan.Report
}

func newRoutedPair(t *testing.T, opts vxlan.Options) *routedPair {
	t.Helper()
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 2})
	p := &routedPair{}
	for i, h := range lab.Hosts() {
		p.envs[i] = newEnvWith(t, lab, h, opts)
		p.desired[i] = desiredFor(i+1, 2-i)
		p.desired[i].Routed = true
		p.reps[i] = apply(t, p.envs[i].dp, p.desired[i])
		gw := p.desired[i].Bridges[0]
		c, err := lab.AddContainer(h, netnslab.ContainerConfig{
			Bridge: gw.Name, Address: netip.PrefixFrom(gw.Gateway.Addr().Next(), gw.Gateway.Bits()), Gateway: gw.Gateway.Addr(),
		})
		if err != nil {
			t.Fatal(err)
		}
		p.cs[i] = c
	}
	return p
}

// ping has each container ping the other.
func (p *routedPair) ping(t *testing.T) {
	t.Helper()
	for i, a := range p.cs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := a.PingRetry(ctx, p.cs[1-i].Config.Address.Addr(), 3)
		cancel()
		if err != nil {
			t.Fatalf("%s -> %s: %v", a.Name, p.cs[1-i].Config.Address.Addr(), err)
		}
	}
}

// forwarded is the kernel's count of IPv4 packets the host's stack
// forwarded (Ip: ForwDatagrams, from its namespace's /proc/net/snmp).
func forwarded(t *testing.T, h *netnslab.Host) uint64 {
	t.Helper()
	var n uint64
	err := h.Do(func() error {
		// thread-self: /proc/self/net is the namespace of the process's
		// main thread, not of this one.
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i++ {
			if !strings.HasPrefix(lines[i], "Ip: ") || !strings.HasPrefix(lines[i+1], "Ip: ") {
				continue
			}
			names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j, name := range names {
				if name == "ForwDatagrams" && j < len(values) {
					n, err = strconv.ParseUint(values[j], 10, 64)
					return err
				}
			}
		}
		return os.ErrNotExist
	})
	if err != nil {
		t.Fatalf("%s: Ip ForwDatagrams: %v", h.Name, err)
	}
	return n
}

// eachCarveMap calls fn with each map of carve's fast path program at the
// TCX ingress of dev in h, and with the link that attaches it.
func eachCarveMap(h *netnslab.Host, dev string, fn func(m *ebpf.Map, name string, ln link.ID) error) error {
	return h.Do(func() error {
		l, err := h.Netlink()
		if err != nil {
			return err
		}
		lk, err := l.LinkByName(dev)
		l.Close()
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: lk.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		for _, ap := range res.Programs {
			prog, err := ebpf.NewProgramFromID(ap.ID)
			if err != nil {
				return err
			}
			info, err := prog.Info()
			prog.Close()
			if err != nil || info.Name != "carve_fastpath" {
				continue
			}
			ln, ok := ap.LinkID()
			if !ok {
				return errors.New("the kernel gives no link ID")
			}
			ids, _ := info.MapIDs()
			for _, id := range ids {
				m, err := ebpf.NewMapFromID(id)
				if err != nil {
					return err
				}
				mi, err := m.Info()
				if err == nil {
					err = fn(m, mi.Name, ln)
				}
				m.Close()
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// fastPathOn reads the kernel back: the programs named carve_fastpath at
// the ingress of each device of the host, and the entries of their blocks
// map (nil when none is attached).
func fastPathOn(t *testing.T, h *netnslab.Host, devices ...string) map[netip.Prefix][2]uint32 {
	t.Helper()
	var blocks map[netip.Prefix][2]uint32
	for _, dev := range devices {
		err := eachCarveMap(h, dev, func(m *ebpf.Map, name string, _ link.ID) error {
			if name != "carve_blocks" {
				return nil
			}
			got := map[netip.Prefix][2]uint32{}
			var k, v [8]byte
			for it := m.Iterate(); it.Next(&k, &v); {
				pfx := netip.PrefixFrom(netip.AddrFrom4([4]byte(k[4:])), int(binary.NativeEndian.Uint32(k[:4])))
				got[pfx] = [2]uint32{binary.NativeEndian.Uint32(v[:4]), binary.NativeEndian.Uint32(v[4:])}
			}
			if blocks != nil && len(got) != len(blocks) {
				t.Errorf("%s: two blocks maps disagree: %v and %v", h.Name, blocks, got)
			}
			blocks = got
			return nil
		})
		if err != nil {
			t.Fatalf("%s: read the fast path back: %v", h.Name, err)
		}
	}
	return blocks
}

func ifindex(t *testing.T, e *env, name string) uint32 {
	t.Helper()
	l, err := e.nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(l.Attrs().Index)
}

// TestFastPathForwardsRoutedTraffic: in routed mode the eBPF fast path is
// attached at the underlay device and the bridge, its blocks map holds the
// peer's subnet (via the underlay) and the local bridge's block (via the
// bridge), read back from the kernel, and container-to-container pings
// pass through it, not through the stack's forwarding: the hosts'
// ForwDatagrams stay put while the program's counter grows. A packet from a
// source that is not a routed peer's block (the peer host itself) still
// takes the stack. Leaving routed mode detaches it.
func TestFastPathForwardsRoutedTraffic(t *testing.T) {
	p := newRoutedPair(t, vxlan.Options{})
	for i, e := range p.envs {
		if got := p.reps[i].FastPath; got != vxlan.FastPathOn {
			t.Fatalf("host %d: fast path %q, want %q", i+1, got, vxlan.FastPathOn)
		}
		bridge := p.desired[i].Bridges[0]
		want := map[netip.Prefix][2]uint32{
			subnet(2 - i):           {ifindex(t, e, e.host.Link), 1},
			bridge.Gateway.Masked(): {ifindex(t, e, bridge.Name), 2},
		}
		got := fastPathOn(t, e.host, e.host.Link, bridge.Name)
		diffMaps(t, e.host.Name+" blocks", got, want)
	}
	// Each container's port, which joined the bridge after the reconcile,
	// is shortcut too (the dataplane watches the links).
	for i, e := range p.envs {
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("the fast path on container %d's port", i+1), testutil.True(func() bool {
			return fastPathOn(t, e.host, p.cs[i].HostLink) != nil
		}))
	}
	p.ping(t) // resolves the neighbours (the fast path leaves unresolved ones to the stack), and teaches it the containers
	var fwd, all, into [2]uint64
	for i, e := range p.envs {
		fwd[i] = forwarded(t, e.host)
		all[i], into[i] = e.dp.FastPathPackets()
	}
	p.ping(t)
	for i, e := range p.envs {
		if got := forwarded(t, e.host); got != fwd[i] {
			t.Errorf("host %d: the stack forwarded %d packets during the pings, want 0 (the fast path carries them)", i+1, got-fwd[i])
		}
		// Each ping is a request out of one host's container and a reply
		// into it from the underlay, both through that host's fast path;
		// each packet from the underlay goes straight into its container.
		gotAll, gotInto := e.dp.FastPathPackets()
		if gotAll < all[i]+4 {
			t.Errorf("host %d: the fast path forwarded %d packets during the pings, want at least 4", i+1, gotAll-all[i])
		}
		if gotInto < into[i]+2 {
			t.Errorf("host %d: the fast path sent %d packets straight into the container, want at least 2", i+1, gotInto-into[i])
		}
	}

	// The peer host's own address is no routed block: its packets to a
	// container here take the stack, which forwards them.
	fwd[0] = forwarded(t, p.envs[0].host)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.envs[1].host.PingRetry(ctx, p.cs[0].Config.Address.Addr(), 3); err != nil {
		t.Fatalf("host 2 -> container 1: %v", err)
	}
	if got := forwarded(t, p.envs[0].host); got <= fwd[0] {
		t.Errorf("host 1 forwarded no packet from host 2's own address: the fast path took a source that is no routed block")
	}

	// By hand, on host 1: the program detached from the underlay device
	// and the peer's block deleted from the map. A resync puts both back.
	e := p.envs[0]
	detachAndForget(t, e.host, e.host.Link, subnet(2))
	if got := fastPathOn(t, e.host, e.host.Link); got != nil {
		t.Fatalf("host 1: the program is still attached to %s after the detach: %v", e.host.Link, got)
	}
	resync(t, e.dp, p.desired[0])
	diffMaps(t, "host 1 blocks after the resync", fastPathOn(t, e.host, e.host.Link), map[netip.Prefix][2]uint32{
		subnet(2):                                {ifindex(t, e, e.host.Link), 1},
		p.desired[0].Bridges[0].Gateway.Masked(): {ifindex(t, e, p.desired[0].Bridges[0].Name), 2},
	})

	// Out of routed mode: nothing attached any more.
	for i, e := range p.envs {
		d := p.desired[i]
		d.Routed = false
		rep := apply(t, e.dp, d)
		if rep.FastPath != "" {
			t.Errorf("host %d: fast path %q out of routed mode, want none", i+1, rep.FastPath)
		}
		if got := fastPathOn(t, e.host, e.host.Link, d.Bridges[0].Name); got != nil {
			t.Errorf("host %d: the fast path is still attached out of routed mode: %v", i+1, got)
		}
	}
	p.ping(t)
}

// TestFastPathOff: with Options.NoFastPath routed traffic is forwarded by
// the stack, and no program is attached.
func TestFastPathOff(t *testing.T) {
	p := newRoutedPair(t, vxlan.Options{NoFastPath: true})
	p.ping(t)
	fwd := forwarded(t, p.envs[0].host)
	p.ping(t)
	if got := forwarded(t, p.envs[0].host); got < fwd+2 {
		t.Errorf("host 1 forwarded %d packets during the pings, want at least 2 without the fast path", got-fwd)
	}
	for i, e := range p.envs {
		if p.reps[i].FastPath != vxlan.FastPathOff {
			t.Errorf("host %d: fast path %q, want %q", i+1, p.reps[i].FastPath, vxlan.FastPathOff)
		}
		if got := fastPathOn(t, e.host, e.host.Link, p.desired[i].Bridges[0].Name); got != nil {
			t.Errorf("host %d: a fast path is attached with NoFastPath: %v", i+1, got)
		}
	}
}

// detachAndForget does by hand what an operator's tool could: it detaches
// carve's program from dev of h (through its link) and deletes pfx from
// the program's blocks map.
func detachAndForget(t *testing.T, h *netnslab.Host, dev string, pfx netip.Prefix) {
	t.Helper()
	links := map[link.ID]bool{}
	err := eachCarveMap(h, dev, func(m *ebpf.Map, name string, ln link.ID) error {
		links[ln] = true
		if name != "carve_blocks" {
			return nil
		}
		var k [8]byte
		binary.NativeEndian.PutUint32(k[:4], uint32(pfx.Bits()))
		a := pfx.Addr().As4()
		copy(k[4:], a[:])
		if err := m.Delete(k); err != nil {
			return fmt.Errorf("delete %s: %w", pfx, err)
		}
		return nil
	})
	for id := range links {
		if err != nil {
			break
		}
		var ln link.Link
		if ln, err = link.NewFromID(id); err == nil {
			err = ln.Detach()
			ln.Close()
		}
	}
	if err != nil {
		t.Fatalf("%s: detach the fast path by hand: %v", h.Name, err)
	}
}

// TestFastPathAcrossARestart: while host 1's dataplane is closed (its agent
// stopped), the program is gone from host 1 and the stack forwards the
// pings along the same routes; a new dataplane (the agent back) attaches
// it again, ports included, and carries the pings past the stack.
func TestFastPathAcrossARestart(t *testing.T) {
	p := newRoutedPair(t, vxlan.Options{})
	h := p.envs[0].host
	devs := []string{h.Link, p.desired[0].Bridges[0].Name, p.cs[0].HostLink}
	testutil.Eventually(t, 10*time.Second, "the fast path on container 1's port", testutil.True(func() bool {
		return fastPathOn(t, h, p.cs[0].HostLink) != nil
	}))
	p.ping(t)

	must(t, p.envs[0].dp.Close())
	if got := fastPathOn(t, h, devs...); got != nil {
		t.Fatalf("host 1: the fast path is still attached with its dataplane closed: %v", got)
	}
	fwd := forwarded(t, h)
	p.ping(t)
	if got := forwarded(t, h); got < fwd+2 {
		t.Errorf("host 1 forwarded %d packets with its dataplane closed, want at least 2 (the stack carries them)", got-fwd)
	}

	e := newEnvWith(t, p.envs[0].lab, h, vxlan.Options{})
	if rep := apply(t, e.dp, p.desired[0]); rep.FastPath != vxlan.FastPathOn {
		t.Fatalf("host 1 after the restart: fast path %q, want %q", rep.FastPath, vxlan.FastPathOn)
	}
	for _, dev := range devs {
		if fastPathOn(t, h, dev) == nil {
			t.Errorf("host 1 after the restart: no fast path on %s", dev)
		}
	}
	p.ping(t) // teaches the new program the containers
	fwd = forwarded(t, h)
	all, into := e.dp.FastPathPackets()
	p.ping(t)
	if got := forwarded(t, h); got != fwd {
		t.Errorf("host 1 after the restart: the stack forwarded %d packets, want 0", got-fwd)
	}
	if gotAll, gotInto := e.dp.FastPathPackets(); gotAll < all+2 || gotInto < into+1 {
		t.Errorf("host 1 after the restart: the fast path forwarded %d packets, %d into the container, want at least 2 and 1", gotAll-all, gotInto-into)
	}
}
