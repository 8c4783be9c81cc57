package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/safchain/ethtool"

	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// A tweak is a setting of the data path that carve does not make, measured
// against the data path as carve sets it up: where the overlay's gap to
// the underlay goes, and whether a setting would close it (docs/status.md).
type tweak struct {
	name string
	// set applies the tweak (on) or the setting carve leaves (off).
	set func(on bool) error
}

// labTweaks are the tweaks of a two-host lab: h1, h2 and their containers
// c1, c2.
func labTweaks(h1, h2 *labcluster.Host, c1, c2 *labcluster.Container, vtep string) []tweak {
	hosts := []*netnslab.Namespace{h1.NS.Namespace, h2.NS.Namespace}
	// Each end of each container's veth: in the container and on its host.
	type end struct {
		n    *netnslab.Namespace
		link string
	}
	veths := []end{{c1.NS.Namespace, netnslab.ContainerLink}, {h1.NS.Namespace, c1.NS.HostLink},
		{c2.NS.Namespace, netnslab.ContainerLink}, {h2.NS.Namespace, c2.NS.HostLink}}
	tweaks := []tweak{
		{name: "GRO off on the VTEPs", set: func(on bool) error {
			for _, n := range hosts {
				if err := setFeatures(n, vtep, map[string]bool{"rx-gro": !on}); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "GRO on the containers' veths (both ends)", set: func(on bool) error {
			for _, e := range veths {
				if err := setFeatures(e.n, e.link, map[string]bool{"rx-gro": on}); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "GRO and UDP GRO forwarding on the underlay veths", set: func(on bool) error {
			for _, n := range hosts {
				if err := setFeatures(n, netnslab.HostLink, map[string]bool{"rx-gro": on, "rx-udp-gro-forwarding": on}); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	if _, err := h1.NS.Sysctl("net.bridge.bridge-nf-call-iptables"); err != nil {
		return tweaks // no br_netfilter: bridged packets meet no netfilter hook anyway
	}
	return append(tweaks, tweak{name: "bridge netfilter hooks off in the hosts (bridge-nf-call-*)", set: func(on bool) error {
		v := "1"
		if on {
			v = "0"
		}
		for _, n := range hosts {
			for _, s := range []string{"iptables", "ip6tables", "arptables"} {
				if err := n.SetSysctl("net.bridge.bridge-nf-call-"+s, v); err != nil {
					return err
				}
			}
		}
		return nil
	}})
}

// setFeatures changes a link's offload features (ethtool -K) from inside
// its namespace: the ethtool ioctl acts on the namespace of its socket.
func setFeatures(n *netnslab.Namespace, link string, features map[string]bool) error {
	err := n.Do(func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		return e.Change(link, features)
	})
	if err != nil {
		return fmt.Errorf("features %v of %s in %s: %w", features, link, n.Name, err)
	}
	return nil
}

// measureTweaks measures the overlay's single TCP stream with each tweak
// beside the overlay as carve sets it, alternating the two, and restores
// carve's settings after each.
func (m *meter) measureTweaks(ctx context.Context, over *path, tweaks []tweak, rounds int, variant string) (benchtable.Table, error) {
	t := benchtable.Table{Title: fmt.Sprintf("data path settings carve does not make, each beside the %s as carve sets it up (TCP, 1 stream, container -> container)", variant)}
	for _, tw := range tweaks {
		var with, without [2][]float64 // throughput, per CPU-second
		for round := range rounds {
			for _, side := range []struct {
				on  bool
				acc *[2][]float64
			}{{false, &without}, {true, &with}} {
				if err := tw.set(side.on); err != nil {
					return t, errors.Join(err, tw.set(false))
				}
				fmt.Fprintf(os.Stderr, "== %s: %v (round %d of %d)\n", tw.name, side.on, round+1, rounds)
				v, err := m.tcp(ctx, over, 1)
				if err != nil {
					return t, errors.Join(err, tw.set(false))
				}
				side.acc[0] = append(side.acc[0], v[0])
				side.acc[1] = append(side.acc[1], v[1])
			}
		}
		if err := tw.set(false); err != nil {
			return t, err
		}
		base := variant + " as carve sets it, same run"
		note := fmt.Sprintf("median of %d rounds", rounds)
		t.Add(benchtable.Row{Name: tw.name, Value: median(with[0]), Unit: "Gbit/s", Baseline: base, BaseVal: median(without[0]),
			HigherIsBetter: true, Note: note})
		t.Add(benchtable.Row{Name: tw.name + ", per CPU-second", Value: median(with[1]), Unit: "Gbit/CPU-s", Baseline: base,
			BaseVal: median(without[1]), HigherIsBetter: true, Note: note})
	}
	return t, nil
}
