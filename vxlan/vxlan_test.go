package vxlan_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"

	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
)

func TestCreate(t *testing.T) {
	e := newEnv(t)
	rootForward, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	d := desiredN(3)
	rep := apply(t, e.dp, d)
	if !rep.Full {
		t.Error("first Apply should be a full reconcile")
	}
	want := map[string]vxlan.Counts{
		"vtep": {Added: 1}, "neighbours": {Added: 3}, "fdb": {Added: 3}, "routes": {Added: 3},
		"bridges": {Added: 1}, "sysctls": {Updated: 1},
	}
	got := map[string]vxlan.Counts{
		"vtep": rep.VTEP, "neighbours": rep.Neighbours, "fdb": rep.FDB, "routes": rep.Routes,
		"bridges": rep.Bridges, "sysctls": rep.Sysctls,
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("report %s = %+v, want %+v", k, got[k], w)
		}
	}
	assertKernel(t, e.nl, d)

	// The VTEP as DESIGN.md describes it.
	l, err := e.nl.LinkByName(vtepName)
	if err != nil {
		t.Fatal(err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		t.Fatalf("VTEP is a %s", l.Type())
	}
	if vx.VxlanId != 1024 || vx.Port != 4789 || vx.Learning || !vx.SrcAddr.Equal(net.IP(d.VTEP.Local.AsSlice())) ||
		vx.HardwareAddr.String() != d.VTEP.MAC.String() || vx.MTU != 1450 || vx.Flags&net.FlagUp == 0 || vx.Alias != vxlan.OwnerAlias {
		t.Errorf("VTEP = id %d port %d learning %v local %s mac %s mtu %d flags %v alias %q",
			vx.VxlanId, vx.Port, vx.Learning, vx.SrcAddr, vx.HardwareAddr, vx.MTU, vx.Flags, vx.Alias)
	}
	assertAddrs(t, e.nl, vtepName, "100.64.0.1/16")

	br, err := e.nl.LinkByName("m-carve")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := br.(*netlink.Bridge); !ok || br.Attrs().MTU != 1420 || br.Attrs().Flags&net.FlagUp == 0 || br.Attrs().Alias != vxlan.OwnerAlias {
		t.Errorf("bridge = %s mtu %d flags %v alias %q", br.Type(), br.Attrs().MTU, br.Attrs().Flags, br.Attrs().Alias)
	}
	assertAddrs(t, e.nl, "m-carve", "10.128.1.1/25")

	if v, err := e.host.Sysctl("net.ipv4.ip_forward"); err != nil || v != "1" {
		t.Errorf("ip_forward in the namespace = %q, %v; want 1", v, err)
	}
	rootAfter, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	if string(rootAfter) != string(rootForward) {
		t.Errorf("root namespace ip_forward changed from %q to %q", rootForward, rootAfter)
	}
}

// TestIdempotent: a second Apply and a Resync change nothing, keep the VTEP
// (same ifindex) and do not flush its neighbours: not a single netlink
// notification is emitted.
func TestIdempotent(t *testing.T) {
	e := newEnv(t)
	d := desiredN(50)
	apply(t, e.dp, d)
	before := assertKernel(t, e.nl, d)

	w := newWatch(t, e.host)
	assertNoChange(t, "second Apply", apply(t, e.dp, d))
	rep := resync(t, e.dp, d)
	assertNoChange(t, "Resync", rep)
	if !rep.Full {
		t.Error("Resync should report Full")
	}
	assertNoChange(t, "second Resync", resync(t, e.dp, d))
	w.assertQuiet(t)

	after := assertKernel(t, e.nl, d)
	if after.vtepIndex != before.vtepIndex {
		t.Fatalf("VTEP ifindex %d -> %d: it was replaced", before.vtepIndex, after.vtepIndex)
	}

	// A new Dataplane (an agent restart) starts with a full pass that also
	// finds nothing to do.
	dp2, err := vxlan.New(vxlan.Options{NetNS: e.host.NsHandle(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer dp2.Close()
	assertNoChange(t, "Apply after restart", apply(t, dp2, d))
	w.assertQuiet(t)
}

func TestCanceled(t *testing.T) {
	e := newEnv(t)
	d := desiredN(20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := e.dp.Apply(ctx, d)
	if err == nil || !errors.Is(rep.Errors[0], context.Canceled) {
		t.Fatalf("canceled Apply: %v", err)
	}
	apply(t, e.dp, d)
	assertKernel(t, e.nl, d)
	assertNoChange(t, "Resync", resync(t, e.dp, d))
}

func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	e := newEnv(t)
	d := desiredN(3000)
	rep := apply(t, e.dp, d)
	if rep.Routes.Added != 3000 || rep.Neighbours.Added != 3000 || rep.FDB.Added != 3000 {
		t.Fatalf("%+v", rep)
	}
	assertKernel(t, e.nl, d)
	assertNoChange(t, "Resync", resync(t, e.dp, d))
	d2 := desiredN(2990)
	rep = apply(t, e.dp, d2)
	if rep.Routes.Removed != 10 || rep.Changes() != 30 {
		t.Fatalf("%+v", rep)
	}
	assertKernel(t, e.nl, d2)
}

func TestClose(t *testing.T) {
	e := newEnv(t)
	must(t, e.dp.Close())
	must(t, e.dp.Close())
	if _, err := e.dp.Apply(context.Background(), desiredN(1)); err == nil {
		t.Fatal("Apply after Close")
	}
}
