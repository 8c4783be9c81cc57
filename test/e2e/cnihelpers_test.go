package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/test/lab/labcluster"
)

// mesosBridge is h's mesos sub-subnet on overlay, as its agent reports it.
func mesosBridge(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string) netip.Prefix {
	t.Helper()
	info, err := c.AgentClient(h).Overlay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ov := info.Overlay(overlay)
	if ov == nil || ov.MesosBridge == nil {
		t.Fatalf("agent on %s reports no mesos bridge on %s: %+v", h.Name, overlay, info)
	}
	p, err := netip.ParsePrefix(ov.MesosBridge.IP)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// inBridge checks that addr is a container address of the bridge's
// sub-subnet, with its prefix: not its network, gateway or broadcast address.
func inBridge(addr, bridge netip.Prefix) error {
	sub := bridge.Masked()
	a := addr.Addr()
	switch {
	case addr.Bits() != sub.Bits():
		return fmt.Errorf("address %s has not the bridge's prefix /%d", addr, sub.Bits())
	case !sub.Contains(a):
		return fmt.Errorf("address %s outside the host's mesos sub-subnet %s", addr, sub)
	case a == sub.Addr() || a == sub.Addr().Next() || !sub.Contains(a.Next()):
		return fmt.Errorf("address %s is the network, gateway or broadcast address of %s", addr, sub)
	}
	return nil
}

// allocations is the agent's IPAM list on overlay, read through its socket.
func allocations(ctx context.Context, t *testing.T, c *labcluster.Cluster, h *labcluster.Host, overlay string) map[types.GCAttachment]netip.Prefix {
	t.Helper()
	list, err := c.IPAMClient(h).List(ctx, overlay)
	if err != nil {
		t.Fatalf("IPAM list of %s: %v", h.Name, err)
	}
	out := map[types.GCAttachment]netip.Prefix{}
	for _, a := range list.Allocations {
		if len(a.IPs) != 1 {
			t.Fatalf("allocation %+v: want one address", a)
		}
		at := types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}
		if _, dup := out[at]; dup {
			t.Fatalf("%s/%s listed twice", a.ContainerID, a.IfName)
		}
		out[at] = netip.MustParsePrefix(a.IPs[0].Address)
	}
	return out
}

func mapsEqual(a, b map[types.GCAttachment]netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// diff describes how the agent's allocations (got) differ from want.
func diff(got, want map[types.GCAttachment]netip.Prefix) string {
	var extra, missing, wrong []string
	for k, v := range got {
		if w, ok := want[k]; !ok {
			extra = append(extra, fmt.Sprintf("%s/%s=%s", k.ContainerID, k.IfName, v))
		} else if w != v {
			wrong = append(wrong, fmt.Sprintf("%s/%s=%s (want %s)", k.ContainerID, k.IfName, v, w))
		}
	}
	for k, v := range want {
		if _, ok := got[k]; !ok {
			missing = append(missing, fmt.Sprintf("%s/%s=%s", k.ContainerID, k.IfName, v))
		}
	}
	slices.Sort(extra)
	slices.Sort(missing)
	slices.Sort(wrong)
	return fmt.Sprintf("the agent holds %d, want %d; extra %v; missing %v; different %v", len(got), len(want), extra, missing, wrong)
}

func attachments(cs []*labcluster.Container) []types.GCAttachment {
	out := make([]types.GCAttachment, 0, len(cs))
	for _, ct := range cs {
		out = append(out, ct.Attachment())
	}
	return out
}

// eth0Addr reads the IPv4 address of the container's interface from its
// namespace (invalid when it has none, or no interface).
func eth0Addr(t *testing.T, ct *labcluster.Container) netip.Prefix {
	t.Helper()
	nh, err := ct.NS.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	link, err := nh.LinkByName(ct.IfName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return netip.Prefix{}
		}
		t.Fatalf("%s in %s: %v", ct.IfName, ct.Name, err)
	}
	addrs, err := nh.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 {
		if len(addrs) > 1 {
			t.Errorf("%s in %s has %d addresses: %v", ct.IfName, ct.Name, len(addrs), addrs)
		}
		return netip.Prefix{}
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	ones, _ := addrs[0].Mask.Size()
	return netip.PrefixFrom(a, ones)
}

// kernelAddrs checks that every container's interface holds the address of
// its ADD result, and that no two containers hold the same one.
func kernelAddrs(t *testing.T, cs []*labcluster.Container) {
	t.Helper()
	seen := map[netip.Addr]string{}
	var probs []string
	for _, ct := range cs {
		got := eth0Addr(t, ct)
		if got != ct.Addr {
			probs = append(probs, fmt.Sprintf("%s: eth0 has %v, its ADD result %s", ct.Name, got, ct.Addr))
		}
		if o, dup := seen[ct.Addr.Addr()]; dup {
			probs = append(probs, fmt.Sprintf("%s and %s both hold %s", o, ct.Name, ct.Addr))
		}
		seen[ct.Addr.Addr()] = ct.Name
	}
	if len(probs) > 0 {
		t.Errorf("%d problems: %s", len(probs), strings.Join(probs, "; "))
	}
}

// checkAll runs CNI CHECK on every container, a few at a time.
func checkAll(ctx context.Context, t *testing.T, c *labcluster.Cluster, cs []*labcluster.Container) {
	t.Helper()
	errs := make([]error, len(cs))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, ct := range cs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = c.CheckCNIContainer(ctx, ct)
		})
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Errorf("CHECK failed on %d of %d containers; first: %v", len(failed), len(cs), failed[0])
	}
}
