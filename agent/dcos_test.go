package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/dcosproto"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// masterStatus is the status the masters show for an agent's overlay.
func masterStatus(ctx context.Context, cl *apiclient.Client, id, overlay string) (api.OverlayState, *api.AgentInfo, error) {
	a, err := cl.Agent(ctx, id)
	if err != nil {
		return api.OverlayState{}, nil, err
	}
	ov := a.Overlay(overlay)
	if ov == nil {
		return api.OverlayState{}, a, fmt.Errorf("%s has no overlay %s", id, overlay)
	}
	return ov.State, a, nil
}

// TestAgentReportsConfigurationResult runs agents on DC/OS's default
// configuration (IPv4 dcos, IPv6-only dcos6, vtep_subnet6): each configures
// its VTEP (with its vtep_ip6) and bridges and reports the result; the
// masters show STATUS_OK per overlay. A bridge name held by a device carve
// did not create makes that overlay (only) STATUS_FAILED with the error in
// the masters' state, while the agent keeps serving its lease (a report
// never feeds back into what the agent acts on) and the record's version
// stays; once the device is gone the agent reports STATUS_OK again. The
// agent endpoint decodes with DC/OS's AgentInfo.
func TestAgentReportsConfigurationResult(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root to create network namespaces")
	cfg, err := state.LoadConfig("../master/state/testdata/dcos-default-network.json")
	if err != nil {
		t.Fatal(err)
	}
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 2})
	hosts := lab.Hosts()
	dir := t.TempDir()
	m := mastertest.Start(t, filepath.Join(dir, "m1"), cfg, quietLogger())
	url := "http://" + m.HTTPAddr()
	cl, err := apiclient.NewClient([]string{url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// host 2's m-dcos6 is taken by a device carve did not create.
	nh, err := hosts[1].Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	squatter := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "m-dcos6"}, PeerName: "squat-peer"}
	if err := nh.LinkAdd(squatter); err != nil {
		t.Fatal(err)
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 11, GossipInterval: 300 * time.Millisecond})
	t.Cleanup(gnet.Close)
	agents := make([]*runningAgent, 2)
	for i, h := range hosts {
		agents[i] = startAgent(t, h, url, filepath.Join(dir, fmt.Sprintf("a%d", i)), gnet)
	}

	testutil.Eventually(t, 0, "host-1 reports OK for dcos and dcos6", func() error {
		for _, name := range []string{"dcos", "dcos6"} {
			st, _, err := masterStatus(ctx, cl, "host-1", name)
			if err != nil {
				return err
			}
			if st.Status != api.StatusOK {
				return fmt.Errorf("%s: %+v", name, st)
			}
		}
		return nil
	})
	var failedVersion uint64
	testutil.Eventually(t, 0, "host-2 reports dcos6 FAILED and dcos OK", func() error {
		st6, a, err := masterStatus(ctx, cl, "host-2", "dcos6")
		if err != nil {
			return err
		}
		st, _, err := masterStatus(ctx, cl, "host-2", "dcos")
		if err != nil {
			return err
		}
		if st6.Status != api.StatusFailed || st6.Error == "" || st.Status != api.StatusOK || a.ConfigurationAttempts == 0 {
			return fmt.Errorf("dcos6 %+v, dcos %+v, attempts %d", st6, st, a.ConfigurationAttempts)
		}
		failedVersion = a.Version
		return nil
	})
	// The failure reported is not acted on: the IPAM serves dcos6.
	if st := agents[1].IPAM().Status("dcos6"); !st.Ready {
		t.Errorf("host-2's IPAM stopped serving dcos6 after reporting it failed: %+v", st)
	}

	// The agent endpoint is DC/OS's AgentInfo.
	for i, a := range agents {
		resp, err := http.Get("http://" + a.HTTPAddr() + "/overlay-agent/overlay")
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		msg, err := dcosproto.Decode("AgentInfo", raw)
		if err == nil {
			err = dcosproto.CheckAgent(msg)
		}
		if err != nil {
			t.Errorf("agent %d endpoint: %v\n%s", i+1, err, raw)
		}
	}

	// The kernel holds the IPv6 VTEP address and the peer's vtep_ip6.
	info1 := agents[0].Overlay()
	vx1 := info1.Overlay("dcos").Backend.VXLAN
	vtep6, err := netip.ParsePrefix(vx1.VTEPIP6)
	if err != nil || vx1.VTEPPort != state.DefaultVTEPPort {
		t.Fatalf("host-1 vtep_ip6 %q (%v), port %d", vx1.VTEPIP6, err, vx1.VTEPPort)
	}
	testutil.Eventually(t, 0, "host-2's kernel has host-1's vtep_ip6 neighbour and its own vtep_ip6", func() error {
		link, err := nh.LinkByName("vtep1024")
		if err != nil {
			return err
		}
		neighs, err := nh.NeighList(link.Attrs().Index, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		found := false
		for _, n := range neighs {
			if ip, _ := netip.AddrFromSlice(n.IP); ip == vtep6.Addr() && n.HardwareAddr.String() == vx1.VTEPMAC && n.State&netlink.NUD_PERMANENT != 0 {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("no permanent neighbour %s -> %s", vtep6.Addr(), vx1.VTEPMAC)
		}
		addrs, err := nh.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		own := agents[1].Overlay().Overlay("dcos").Backend.VXLAN.VTEPIP6
		for _, a := range addrs {
			if a.IPNet.String() == own {
				return nil
			}
		}
		return fmt.Errorf("%s not on host-2's VTEP: %v", own, addrs)
	})

	// The device goes away: the next resync configures dcos6, reported OK,
	// and the record's version never moved for reports.
	if err := nh.LinkDel(squatter); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "host-2 reports dcos6 OK", func() error {
		st, a, err := masterStatus(ctx, cl, "host-2", "dcos6")
		if err != nil {
			return err
		}
		if st.Status != api.StatusOK {
			return fmt.Errorf("dcos6 %+v", st)
		}
		if a.Version != failedVersion {
			t.Errorf("host-2's record version moved %d -> %d on reports", failedVersion, a.Version)
		}
		return nil
	})
}
