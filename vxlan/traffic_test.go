package vxlan_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/netnslab"
	"github.com/carve-net/carve/vxlan"
)

func subnet6(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:%x::/64", i))
}

// dualStack is agent self's desired state with an IPv6 overlay as well.
func dualStack(self int, others ...int) vxlan.Desired {
	d := desiredFor(self, others...)
	d.Bridges[0].Gateway6 = netip.MustParsePrefix(fmt.Sprintf("fd00:%x::1/80", self))
	d.IPv6Forward = true
	for i, o := range others {
		d.Peers[i].Subnets = append(d.Peers[i].Subnets, subnet6(o))
	}
	return d
}

// TestTraffic programs three hosts on an underlay bridge and pings between
// containers on different hosts, over IPv4 and IPv6, through the overlay.
func TestTraffic(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 3})
	hosts := lab.Hosts()
	ids := []int{1, 2, 3}
	envs := make([]*env, 3)
	containers := make([]*netnslab.Container, 3)
	desired := make([]vxlan.Desired, 3)
	for i, h := range hosts {
		self := ids[i]
		var others []int
		for _, o := range ids {
			if o != self {
				others = append(others, o)
			}
		}
		if h.IP.Addr() != underlayIP(self) {
			t.Fatalf("host %d has underlay %s, want %s", self, h.IP, underlayIP(self))
		}
		envs[i] = newEnvOn(t, lab, h)
		desired[i] = dualStack(self, others...)
		apply(t, envs[i].dp, desired[i])
		gw := desired[i].Bridges[0]
		c, err := lab.AddContainer(h, netnslab.ContainerConfig{
			Bridge:   gw.Name,
			Address:  netip.PrefixFrom(gw.Gateway.Addr().Next(), gw.Gateway.Bits()),
			Gateway:  gw.Gateway.Addr(),
			Address6: netip.PrefixFrom(gw.Gateway6.Addr().Next(), gw.Gateway6.Bits()),
			Gateway6: gw.Gateway6.Addr(),
		})
		if err != nil {
			t.Fatal(err)
		}
		containers[i] = c
	}
	ping := func(from, to *netnslab.Container, want bool) {
		t.Helper()
		for _, dst := range []netip.Addr{to.Config.Address.Addr(), to.Config.Address6.Addr()} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := from.PingRetry(ctx, dst, 3)
			cancel()
			if want && err != nil {
				t.Errorf("%s -> %s: %v", from.Name, dst, err)
			}
			if !want && err == nil {
				t.Errorf("%s -> %s answered, want no path", from.Name, dst)
			}
		}
	}
	for i, a := range containers {
		for j, b := range containers {
			if i != j {
				ping(a, b, true)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Host 1 forgets host 3: no path from container 1 to container 3 any
	// more (host 3 still knows host 1, the return path is not enough).
	d := dualStack(1, 2)
	apply(t, envs[0].dp, d)
	assertKernel(t, envs[0].nl, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := containers[0].Ping(ctx, containers[2].Config.Address.Addr()); err == nil {
		t.Error("ping through a removed peer answered")
	}
	ping(containers[0], containers[1], true)
	// Back again.
	apply(t, envs[0].dp, desired[0])
	ping(containers[0], containers[2], true)
}
