package vxlan_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
)

// TestDeviceMismatch changes the VTEP by hand. Identity parameters get the
// device replaced (new ifindex) and everything on it re-added; MTU and up
// state are fixed in place without disturbing its entries.
func TestDeviceMismatch(t *testing.T) {
	recreate := func(f func(vx *netlink.Vxlan)) func(t *testing.T, e *env) {
		return func(t *testing.T, e *env) {
			t.Helper()
			l, err := e.nl.LinkByName(vtepName)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.nl.LinkDel(l); err != nil {
				t.Fatal(err)
			}
			vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: vtepName, MTU: 1450, HardwareAddr: vtepMAC(1)},
				VxlanId: 1024, Port: 4789, SrcAddr: net.IP(underlayIP(1).AsSlice())}
			f(vx)
			if err := e.nl.LinkAdd(vx); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name     string
		change   func(t *testing.T, e *env)
		replaced bool
	}{
		{"VNI", recreate(func(vx *netlink.Vxlan) { vx.VxlanId = 7 }), true},
		{"port", recreate(func(vx *netlink.Vxlan) { vx.Port = 8472 }), true},
		{"local", recreate(func(vx *netlink.Vxlan) { vx.SrcAddr = net.ParseIP("198.18.0.99") }), true},
		{"learning", recreate(func(vx *netlink.Vxlan) { vx.Learning = true }), true},
		{"MAC", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetHardwareAddr(l, mustMAC("70:b3:d5:40:ff:ff")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"not vxlan", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkDel(l); err != nil {
				t.Fatal(err)
			}
			if err := e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: vtepName}}); err != nil {
				t.Fatal(err)
			}
			d, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetAlias(d, vxlan.OwnerAlias); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"deleted", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkDel(l); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"MTU", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetMTU(l, 1300); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"down", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetDown(l); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"address", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			a, _ := netlink.ParseAddr("100.64.0.1/16")
			if err := e.nl.AddrDel(l, a); err != nil {
				t.Fatal(err)
			}
			b, _ := netlink.ParseAddr("100.64.0.77/24")
			if err := e.nl.AddrAdd(l, b); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range cases {
		for _, entry := range []string{"Apply", "Resync"} {
			t.Run(tc.name+"/"+entry, func(t *testing.T) {
				e := newEnv(t)
				d := desiredN(3)
				apply(t, e.dp, d)
				before := readKernel(t, e.nl)
				tc.change(t, e)
				var rep vxlan.Report
				var err error
				if entry == "Apply" {
					rep, err = e.dp.Apply(context.Background(), d)
				} else {
					rep, err = e.dp.Resync(context.Background(), d)
				}
				if err != nil {
					t.Fatal(err)
				}
				if rep.Changes() == 0 {
					t.Fatal("nothing was repaired")
				}
				after := assertKernel(t, e.nl, d)
				if replaced := after.vtepIndex != before.vtepIndex; replaced != tc.replaced {
					t.Errorf("replaced = %v (ifindex %d -> %d), want %v", replaced, before.vtepIndex, after.vtepIndex, tc.replaced)
				}
				l, _ := e.nl.LinkByName(vtepName)
				if vx, ok := l.(*netlink.Vxlan); !ok || vx.VxlanId != 1024 || vx.Port != 4789 || vx.Learning ||
					vx.MTU != 1450 || vx.Flags&net.FlagUp == 0 || vx.HardwareAddr.String() != vtepMAC(1).String() {
					t.Errorf("VTEP not repaired: %+v", l.Attrs())
				}
				assertAddrs(t, e.nl, vtepName, "100.64.0.1/16")
				assertNoChange(t, "Resync after repair", resync(t, e.dp, d))
			})
		}
	}
}

// TestForeignDevice: a non-VXLAN device with the VTEP's name that carve did
// not create is not deleted; the reconcile fails with a clear error.
func TestForeignDevice(t *testing.T) {
	e := newEnv(t)
	if err := e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: vtepName}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.dp.Apply(context.Background(), desiredN(1))
	if err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Fatalf("err = %v, want a refusal", err)
	}
	if l, err := e.nl.LinkByName(vtepName); err != nil || l.Type() != "bridge" {
		t.Fatalf("foreign device touched: %v %v", l, err)
	}
}

// TestVTEPRename: a new VTEP name (a changed network config) replaces carve's
// old VTEP, incrementally and on a restart alike.
func TestVTEPRename(t *testing.T) {
	for _, restart := range []bool{false, true} {
		e := newEnv(t)
		d := desiredN(2)
		apply(t, e.dp, d)
		d.VTEP.Name = "vtep2048"
		dp := e.dp
		if restart {
			var err error
			if dp, err = vxlan.New(vxlan.Options{NetNS: e.host.NsHandle(), Logger: slog.New(slog.DiscardHandler)}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dp.Close() })
		}
		rep := apply(t, dp, d)
		if rep.VTEP.Added != 1 || rep.VTEP.Removed != 1 {
			t.Errorf("restart %v: VTEP counts %+v", restart, rep.VTEP)
		}
		if _, err := e.nl.LinkByName(vtepName); err == nil {
			t.Errorf("restart %v: old VTEP left", restart)
		}
		l, err := e.nl.LinkByName("vtep2048")
		if err != nil {
			t.Fatal(err)
		}
		routes, err := e.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: vxlan.Protocol}, netlink.RT_FILTER_PROTOCOL)
		must(t, err)
		if len(routes) != 2 || routes[0].LinkIndex != l.Attrs().Index {
			t.Errorf("restart %v: routes %v", restart, routes)
		}
		assertNoChange(t, "Resync", resync(t, dp, d))
	}
}
