package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/benchtable"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/ring"
)

// gossipBytesRows measures, in process and deterministically, the
// membership and ring messages an agent sends at n agents, encoded exactly
// as the agent encodes them (membership.AntiEntropyRound), beside the whole
// state that periodic gossip carried before deltas and digests, built from
// the same memberships.
func gossipBytesRows(n int) (rows []benchtable.Row, err error) {
	tbl := &benchtable.Table{}
	defer func() { rows = tbl.Rows }()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	const cluster = "bench-cluster"
	record := func(i int, v uint64) membership.PeerRecord {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i / 250), byte(i%250 + 1)})
		info := &api.AgentInfo{AgentID: fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i), IP: ip.String(), MeshAddr: ip.String() + ":6783", Version: v,
			Overlays: []api.AgentOverlay{{Info: api.OverlayNetwork{Name: "carve"},
				Subnet:      fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256),
				MesosBridge: &api.BridgeInfo{IP: fmt.Sprintf("10.%d.%d.0/25", 128+i/256, i%256)},
				Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VTEPIP: fmt.Sprintf("100.64.%d.%d/16", i/250, i%250+1),
					VTEPMAC: api.VTEPMAC([3]byte{0x70, 0xb3, 0xd5}, netip.AddrFrom4([4]byte{100, 64, byte(i / 250), byte(i%250 + 1)})).String()}},
				State: api.OverlayState{Status: api.StatusOK}}}}
		info.Signature = api.Sign(priv, api.RecordSigningBytes(info, cluster))
		return membership.NewPeerRecord(info)
	}
	a := membership.New()
	var st membership.State
	for i := range n {
		st.Records = append(st.Records, record(i, uint64(100+i)))
	}
	a.MergeFromMasters(st)
	b := membership.New()
	b.MergeFromMasters(a.State())

	whole, err := json.Marshal(membership.Message{ClusterID: cluster, State: a.State()})
	if err != nil {
		return nil, err
	}
	changed := record(n/2, uint64(100+n+1))
	delta, err := json.Marshal(membership.Message{ClusterID: cluster, State: membership.State{Records: []membership.PeerRecord{changed}}})
	if err != nil {
		return nil, err
	}
	equal := membership.AntiEntropyRound(cluster, "a", a, b)
	a.MergeFromMasters(membership.State{Records: []membership.PeerRecord{changed}})
	oneOff := membership.AntiEntropyRound(cluster, "a", a, b)
	if again := membership.AntiEntropyRound(cluster, "a", a, b); again.Messages != 1 {
		return nil, fmt.Errorf("%d agents: one round did not reconcile the memberships (%+v)", n, again)
	}
	base := "whole membership (periodic gossip before)"
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, membership: one change, broadcast delta (%d agents)", n), Value: float64(len(delta)), Unit: "B/msg",
		Baseline: base, BaseVal: float64(len(whole))})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, membership: anti-entropy round, in sync (%d agents)", n), Value: float64(equal.Total()), Unit: "B/round",
		Baseline: base, BaseVal: float64(len(whole)), Note: "the digest alone"})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, membership: anti-entropy round, one record behind (%d agents)", n), Value: float64(oneOff.Total()), Unit: "B/round",
		Baseline: base, BaseVal: float64(len(whole)), Note: fmt.Sprintf("digest %d + summary %d + push %d", oneOff.Digest, oneOff.Summary, oneOff.Push)})

	ringRows, err := ringGossipRows(cluster, n)
	if err != nil {
		return nil, err
	}
	for _, r := range ringRows {
		tbl.Add(r)
	}
	return nil, nil
}

// ringGossipRows measures the ring channel's messages at n agents, as the
// agents encode them (agent/ipam's RingDeltaBytes and
// RingAntiEntropyRound), beside the whole ring that was broadcast and
// pushed before deltas and bucketed digests: one overlay ring with a lease
// per agent and each agent's free count written, as every agent holds it.
func ringGossipRows(cluster string, n int) ([]benchtable.Row, error) {
	owner := func(i int) string { return fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i) }
	subnet := func(i int) netip.Prefix {
		return netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256))
	}
	r, err := ring.NewRing(netip.MustParsePrefix("10.128.0.0/9"))
	if err != nil {
		return nil, err
	}
	var leases []ring.Lease
	for i := range n {
		leases = append(leases, ring.Lease{Owner: owner(i), Prefix: subnet(i), Version: uint64(100 + i)})
	}
	if _, err := r.Seed(leases, nil); err != nil {
		return nil, err
	}
	for i := range n {
		if _, err := r.ReportFree(owner(i), map[netip.Addr]ring.Uint128{subnet(i).Addr(): ring.U128(200)}); err != nil {
			return nil, err
		}
	}
	whole, err := ipam.RingDeltaBytes(cluster, "carve", nil, r)
	if err != nil {
		return nil, err
	}
	base := "the whole ring (broadcast and pushed before)"
	var rows []benchtable.Row

	// One allocation: the agent's free count, announced.
	after := r.Clone()
	if _, err := after.ReportFree(owner(n/2), map[netip.Addr]ring.Uint128{subnet(n / 2).Addr(): ring.U128(199)}); err != nil {
		return nil, err
	}
	alloc, err := ipam.RingDeltaBytes(cluster, "carve", r, after)
	if err != nil {
		return nil, err
	}
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: one allocation's free count, broadcast delta (%d agents)", n), Value: float64(alloc), Unit: "B/msg",
		Baseline: base, BaseVal: float64(whole)})

	// A grant through the ring: a /26 of one agent's subnet to another.
	granted := r.Clone()
	if err := granted.Grant(owner(n/3), owner(n/3+1), netip.PrefixFrom(subnet(n/3).Addr(), 26)); err != nil {
		return nil, err
	}
	grant, err := ipam.RingDeltaBytes(cluster, "carve", r, granted)
	if err != nil {
		return nil, err
	}
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: a grant through the ring, broadcast delta (%d agents)", n), Value: float64(grant), Unit: "B/msg",
		Baseline: base, BaseVal: float64(whole)})
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: a registration, per agent (%d agents)", n), Value: 0, Unit: "B/agent",
		Baseline: "each agent broadcast its changed ring before", BaseVal: float64(whole),
		Note: "every agent seeds the new lease from its own view"})

	// Anti-entropy: in sync, then one allocation behind.
	idA, idB := owner(0), owner(1)
	inSync, err := ipam.RingAntiEntropyRound(cluster, "carve", idA, idB, after, after.Clone())
	if err != nil {
		return nil, err
	}
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: anti-entropy round, in sync (%d agents)", n), Value: float64(inSync.Total()), Unit: "B/round",
		Baseline: base, BaseVal: float64(whole), Note: "the digest alone"})
	behind := r.Clone()
	oneOff, err := ipam.RingAntiEntropyRound(cluster, "carve", idA, idB, after.Clone(), behind)
	if err != nil {
		return nil, err
	}
	if !behind.Equal(after) {
		return nil, fmt.Errorf("%d agents: one ring anti-entropy round did not reconcile the rings", n)
	}
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: anti-entropy round, one allocation behind (%d agents)", n), Value: float64(oneOff.Total()), Unit: "B/round",
		Baseline: base, BaseVal: float64(whole), Note: fmt.Sprintf("digest %d + bucket hashes %d + push %d", oneOff.Digest, oneOff.Buckets, oneOff.Push)})
	return rows, nil
}

// idleCPU reads the process's CPU time from /proc over window (after
// settle, so that start-up work is not counted) and returns CPU seconds per
// minute.
func idleCPU(ctx context.Context, pid int, settle, window time.Duration) (float64, error) {
	if !retry.Sleep(ctx, settle) {
		return 0, ctx.Err()
	}
	before, err := cpuSeconds(pid)
	if err != nil {
		return 0, err
	}
	if !retry.Sleep(ctx, window) {
		return 0, ctx.Err()
	}
	after, err := cpuSeconds(pid)
	if err != nil {
		return 0, err
	}
	return (after - before) / window.Minutes(), nil
}

// cpuSeconds is a process's user and system CPU time, from /proc.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}
