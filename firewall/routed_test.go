package firewall_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/firewall"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// TestRoutedThroughDrop: with a routed data path, containers on two hosts
// reach each other over the underlay device through a FORWARD policy of
// DROP on the receiving host, for the overlay's prefix only: the host's
// underlay neighbour gets no answer from the container (the reply to an
// underlay address is not the overlay's).
func TestRoutedThroughDrop(t *testing.T) {
	overlay := netip.MustParsePrefix("10.128.0.0/9")
	for _, b := range []firewall.Backend{firewall.NFT, firewall.Legacy} {
		t.Run(string(b), func(t *testing.T) {
			f, lab, h1, _ := newForward(t)
			h2, err := lab.AddHost()
			if err != nil {
				t.Fatal(err)
			}
			var cs []*netnslab.Container
			for i, h := range []*netnslab.Host{h1, h2} {
				must(t, h.SetSysctl("net.ipv4.ip_forward", "1"))
				gw := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, byte(i), 1}), 24)
				must(t, h.AddBridge("m-a", gw, 1500))
				c, err := lab.AddContainer(h, netnslab.ContainerConfig{Bridge: "m-a", Address: netip.PrefixFrom(gw.Addr().Next(), 24), Gateway: gw.Addr()})
				if err != nil {
					t.Fatal(err)
				}
				cs = append(cs, c)
			}
			// Each host routes the other's block via its underlay IP.
			for i, h := range []*netnslab.Host{h1, h2} {
				other := []*netnslab.Host{h2, h1}[i]
				nh, err := h.Netlink()
				if err != nil {
					t.Fatal(err)
				}
				l, err := nh.LinkByName(h.Link)
				if err != nil {
					t.Fatal(err)
				}
				dst := &net.IPNet{IP: net.IP{10, 128, byte(1 - i), 0}, Mask: net.CIDRMask(24, 32)}
				must(t, nh.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: other.IP.Addr().AsSlice()}))
			}
			ping := func(from *netnslab.Namespace, to netip.Addr, want bool) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var err error
				if want {
					err = from.PingRetry(ctx, to, 3)
				} else {
					ctx, cancel := context.WithTimeout(ctx, netnslab.DefaultPingTimeout)
					defer cancel()
					if from.Ping(ctx, to) == nil {
						t.Errorf("%s reached %s, want dropped", from.Name, to)
					}
					return
				}
				if err != nil {
					t.Errorf("%s -> %s: %v", from.Name, to, err)
				}
			}
			target := cs[0].Config.Address.Addr()
			ipt(t, h1.Namespace, "iptables-"+string(b), "-w", "-P", "FORWARD", "DROP")
			must(t, f.Ensure(context.Background(), firewall.Rules{Devices: []string{"m-a", "vtep1024"}}))
			ping(cs[1].Namespace, target, false) // VXLAN rules only: the underlay is not carve's
			must(t, f.Ensure(context.Background(), firewall.Rules{Devices: []string{"m-a", "vtep1024"}, Underlay: h1.Link, Routed: []netip.Prefix{overlay}}))
			ping(cs[1].Namespace, target, true)
			ping(cs[0].Namespace, cs[1].Config.Address.Addr(), true)
			ping(h2.Namespace, target, false) // the reply goes to an underlay address
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
