package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	cni "github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/vxlan"
)

// defaultOverlayMTU and defaultVTEPMTU are used while neither the network
// configuration nor any underlay MTU says (see planMTUs).
const (
	defaultOverlayMTU = 1420
	defaultVTEPMTU    = 1450
)

// reconcileLoop programs the kernel: the difference on every change, and a
// full read-back resync every ResyncInterval (which repairs changes made by
// hand). A failed reconcile is retried soon.
func (a *Agent) reconcileLoop(ctx context.Context) {
	// Before the first conflist is written, and off the paths that serve
	// the IPAM socket: the plugin probe takes a moment.
	a.chooseCNIVersion(ctx)
	resync := time.NewTicker(a.cfg.ResyncInterval)
	defer resync.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		full := false
		select {
		case <-ctx.Done():
			return
		case <-a.reconcileCh:
		case <-retry.C:
		case <-resync.C:
			full = true
		}
		if err := a.reconcile(ctx, full); err != nil {
			a.log.Warn("reconcile", "err", err, "full", full)
			retry.Reset(2 * time.Second)
		}
	}
}

// reconcile computes the desired dataplane and applies it. While the agent
// refuses the masters' records, the saved records it no longer verifies
// are kept in what it programs (verify.go, withUnverified): the kernel
// holds them from when they verified, and an agent that dropped them would
// remove every peer it cannot verify now.
func (a *Agent) reconcile(ctx context.Context, full bool) error {
	a.mu.RLock()
	self, network, cluster, merged, unverified := a.self, a.network, a.clusterID, a.mergedIndex, a.unverified
	a.mu.RUnlock()
	if self == nil {
		return nil // never registered and nothing persisted: nothing to program yet
	}
	members := withUnverified(a.members.State(), unverified)
	network = a.withMTUs(network, members)
	a.ipam.Sync(ipamView(cluster, self, network, members, merged))
	// The kernel and the conflists leave out the disabled overlays no
	// container of this host is attached to any more (drain.go).
	drained := drainedOverlays(self, network, a.attachedHere)
	a.noteDrained(self, network, drained)
	selfHere := withoutOverlays(self, drained)
	a.writeConflists(selfHere, network)
	if a.docker != nil {
		a.docker.Sync()
	}
	if len(selfHere.Overlays) == 0 && len(self.Overlays) > 0 {
		// Every overlay of this agent is disabled and drained: the VTEP
		// and bridges stay as they are (docs/operations.md, section 7b).
		return nil
	}
	want, peers, err := desiredState(selfHere, network, a.ip, members, drained)
	if err == nil {
		addGrowth(&want, selfHere, a.ipam, nil)
	}
	if err != nil {
		a.setReport(self.Version, nil, nil, err)
		a.noteReconciled(self)
		return err
	}
	enc := a.wg.planEncryption(self, network, members, &want) // takes the encrypted peers out of VXLAN
	var rep vxlan.Report
	mode := "apply"
	if full {
		mode = "resync"
		rep, err = a.dp.Resync(ctx, want)
	} else {
		rep, err = a.dp.Apply(ctx, want)
	}
	a.metrics.observe(mode, &rep)
	a.keepForwardRules(ctx, &want, enc, full) // after the bridges exist
	a.setReport(self.Version, &rep, peers, err)
	a.mu.Lock()
	a.programmedIndex = merged
	a.mu.Unlock()
	a.noteReconciled(self)
	// After VXLAN: the routes through WireGuard use the VTEP's address.
	return errors.Join(err, a.applyEncryption(ctx, enc)) // the dataplane logs what it changed
}

// writeConflists keeps one CNI network config per overlay that has a mesos
// bridge here, and removes carve's configs of overlays that went away: the
// conflist in CNIConfDir (in the spec version chosen at start, named with
// CNIConfPrefix) and, with MesosCNIConfDir, the single-plugin .conf of the
// Mesos CNI isolator. A config is written only once the overlay has its
// lease, so a runtime never sees a network the agent cannot serve.
func (a *Agent) writeConflists(self *api.AgentInfo, network *api.NetworkConfig) {
	mtu := defaultOverlayMTU
	if network != nil && network.OverlayMTU > 0 {
		mtu = network.OverlayMTU
	}
	var keep []string
	for _, ov := range self.Overlays {
		if leased(&ov) && ov.MesosBridge != nil {
			keep = append(keep, ov.Info.Name)
		}
	}
	conflist := func(ov string) cni.Conflist {
		return cni.Conflist{Overlay: ov, MTU: mtu, Socket: a.cfg.Socket, CNIVersion: a.cniVersion, FilePrefix: a.cfg.CNIConfPrefix}
	}
	for _, w := range []struct {
		dir   string
		what  string
		write func(dir string, c cni.Conflist) (bool, error)
		path  func(dir string, c cni.Conflist) string
		prune func(dir string, keep []string) ([]string, error)
	}{
		{a.cfg.CNIConfDir, "CNI config", cni.WriteConflist,
			func(dir string, c cni.Conflist) string { return cni.ConflistPath(dir, c.FilePrefix, c.Overlay) },
			func(dir string, keep []string) ([]string, error) {
				return cni.PruneConflists(dir, a.cfg.CNIConfPrefix, keep)
			}},
		{a.cfg.MesosCNIConfDir, "Mesos CNI config", cni.WriteConf,
			func(dir string, c cni.Conflist) string { return cni.ConfPath(dir, c.Overlay) }, cni.PruneConfs},
	} {
		if w.dir == "" {
			continue
		}
		wroteAny := false
		for _, ov := range keep {
			wrote, err := w.write(w.dir, conflist(ov))
			if err != nil {
				a.log.Error("write "+w.what, "overlay", ov, "dir", w.dir, "err", err)
				continue
			}
			if wrote {
				wroteAny = true
				a.log.Info(w.what+" written", "path", w.path(w.dir, conflist(ov)), "cni_version", a.cniVersion)
			}
		}
		removed, err := w.prune(w.dir, keep)
		if err != nil {
			a.log.Error("prune "+w.what+"s", "dir", w.dir, "err", err)
		}
		for _, path := range removed {
			a.log.Info(w.what+" removed (overlay gone)", "path", path)
		}
		if wroteAny && w.dir == a.cfg.CNIConfDir {
			a.warnNotFirst(w.dir)
		}
	}
}

// setReport records what the last reconcile achieved.
func (a *Agent) setReport(selfVersion uint64, rep *vxlan.Report, peers map[string]uint64, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastReport, a.lastErr = rep, err
	if rep == nil {
		return
	}
	failed := map[string]bool{}
	for _, e := range rep.Errors {
		if e.Peer != "" {
			failed[e.Peer] = true
		}
	}
	a.attemptedSelf = selfVersion
	a.programmed = map[string]uint64{}
	for id, v := range peers {
		if !failed[id] {
			a.programmed[id] = v
		}
	}
	if err == nil {
		a.reconciledSelf = selfVersion
	}
	a.metrics.peersProgrammed.Set(float64(len(a.programmed)))
	a.metrics.peersKnown.Set(float64(len(peers)))
}

// desiredState computes the dataplane this agent wants: its VTEP, its
// bridges, and an entry set for every other agent with an underlay IP. It
// also returns the peers included, with their versions. No route goes to
// the peers' subnets of the overlays in drained.
func desiredState(self *api.AgentInfo, network *api.NetworkConfig, ip netip.Addr, members membership.State, drained map[string]bool) (vxlan.Desired, map[string]uint64, error) {
	var want vxlan.Desired
	var vx *api.VXLANInfo
	for _, ov := range self.Overlays {
		if ov.Backend != nil && ov.Backend.VXLAN != nil {
			vx = ov.Backend.VXLAN
			break
		}
	}
	if vx == nil {
		return want, nil, fmt.Errorf("the masters gave this agent no VTEP (no overlay leased)")
	}
	addr, err := netip.ParsePrefix(vx.VTEPIP)
	if err != nil {
		return want, nil, fmt.Errorf("own vtep_ip %q: %w", vx.VTEPIP, err)
	}
	mac, err := net.ParseMAC(vx.VTEPMAC)
	if err != nil {
		return want, nil, fmt.Errorf("own vtep_mac %q: %w", vx.VTEPMAC, err)
	}
	want.VTEP = vxlan.VTEP{Name: vx.VTEPName, VNI: vx.VNI, Port: vx.VTEPPort, Local: ip, MAC: mac, MTU: vx.VTEPMTU, Address: addr}
	if network != nil && network.VTEPMTU > 0 {
		want.VTEP.MTU = network.VTEPMTU // the agent's own choice (withMTUs)
	}
	if vx.VTEPIP6 != "" {
		if want.VTEP.Address6, err = netip.ParsePrefix(vx.VTEPIP6); err != nil {
			return want, nil, fmt.Errorf("own vtep_ip6 %q: %w", vx.VTEPIP6, err)
		}
		want.IPv6Forward = true
	}
	want.IPForward = true
	mtu := defaultOverlayMTU
	if network != nil && network.OverlayMTU > 0 {
		mtu = network.OverlayMTU
	}
	for _, ov := range self.Overlays {
		if !leased(&ov) {
			continue
		}
		for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
			if br == nil {
				continue
			}
			b := vxlan.Bridge{Name: br.Name, MTU: mtu}
			if br.IP != "" {
				if b.Gateway, err = gatewayOf(br.IP); err != nil {
					return want, nil, fmt.Errorf("bridge %s: %w", br.Name, err)
				}
			}
			if br.IP6 != "" {
				if b.Gateway6, err = gatewayOf(br.IP6); err != nil {
					return want, nil, fmt.Errorf("bridge %s: %w", br.Name, err)
				}
				want.IPv6Forward = true
			}
			want.Bridges = append(want.Bridges, b)
		}
	}
	peers := map[string]uint64{}
	for _, r := range members.Records {
		if vtep, _ := r.VTEP(); r.ID == self.AgentID || !r.HasIP() || vtep == "" {
			continue
		}
		p, err := peerOf(peerWithout(r, drained))
		if err != nil {
			continue // validated on the way in; a record we cannot use is skipped
		}
		want.Peers = append(want.Peers, p)
		peers[r.ID] = r.Version
	}
	routedPath(&want, network)
	return want, peers, nil
}

// growthView is what routing needs of the IPAM's grown blocks.
type growthView interface {
	BridgeGateways(network, bridge string) []netip.Prefix
	PeerBlocks(known map[string][]netip.Prefix) map[string][]netip.Prefix
}

// addGrowth adds what growth changed to the desired dataplane: a gateway on
// each bridge in every block it grew, and a route to each peer for every
// block it holds beyond its subnets: the blocks the masters list in its
// record (masterBlocks, by agent id) and the grants the rings show that
// the masters do not know yet. A granted block's route is longer than the
// donor's, so it wins.
func addGrowth(want *vxlan.Desired, self *api.AgentInfo, g growthView, masterBlocks map[string][]netip.Prefix) {
	for i := range want.Bridges {
		b := &want.Bridges[i]
		for _, ov := range self.Overlays {
			switch {
			case ov.MesosBridge != nil && ov.MesosBridge.Name == b.Name:
				b.Extra = append(b.Extra, g.BridgeGateways(ov.Info.Name, api.BridgeMesos)...)
			case ov.DockerBridge != nil && ov.DockerBridge.Name == b.Name:
				b.Extra = append(b.Extra, g.BridgeGateways(ov.Info.Name, api.BridgeDocker)...)
			}
		}
	}
	known := map[string][]netip.Prefix{}
	for i := range want.Peers {
		p := &want.Peers[i]
		for _, b := range masterBlocks[p.ID] {
			if !slices.Contains(p.Subnets, b) {
				p.Subnets = append(p.Subnets, b)
			}
		}
		known[p.ID] = slices.Clone(p.Subnets)
	}
	extra := g.PeerBlocks(known)
	for i := range want.Peers {
		p := &want.Peers[i]
		p.Subnets = append(p.Subnets, extra[p.ID]...)
	}
}

func peerOf(r membership.PeerRecord) (vxlan.Peer, error) {
	ip, err := netip.ParseAddr(r.IP)
	if err != nil {
		return vxlan.Peer{}, err
	}
	vtepIP, vtepMAC := r.VTEP()
	vtep, err := netip.ParsePrefix(vtepIP)
	if err != nil {
		return vxlan.Peer{}, err
	}
	mac, err := net.ParseMAC(vtepMAC)
	if err != nil {
		return vxlan.Peer{}, err
	}
	p := vxlan.Peer{ID: r.ID, UnderlayIP: ip, VTEPIP: vtep.Addr(), VTEPMAC: mac}
	if s := r.VTEP6(); s != "" {
		vtep6, err := netip.ParsePrefix(s)
		if err != nil {
			return vxlan.Peer{}, err
		}
		p.VTEPIP6 = vtep6.Addr()
	}
	for _, s := range r.Subnets() {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return vxlan.Peer{}, err
		}
		p.Subnets = append(p.Subnets, pr)
	}
	return p, nil
}

// leased tells whether the masters leased the overlay to this agent: it
// is in the record with a subnet. The agent acts on that, never on the
// overlay's state.status, which is what it reported itself.
func leased(ov *api.AgentOverlay) bool { return ov.Subnet != "" || ov.Subnet6 != "" }

// gatewayOf is the first host address of a bridge's sub-subnet, with its prefix length.
func gatewayOf(subnet string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(p.Masked().Addr().Next(), p.Bits()), nil
}

// urlHostPort returns HOST:PORT of a master URL (port 80 when absent).
func urlHostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("master URL %q: want http://HOST:PORT", raw)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "80"), nil
	}
	return u.Host, nil
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
