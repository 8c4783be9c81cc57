package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/carve-net/carve/test/lab/fakegossip"
	bolt "go.etcd.io/bbolt"
)

// gossipBytesRows measures, in process and deterministically, the
// membership and ring messages agents send at n agents: two real gossip
// handlers of each channel (membership.Handler, ipam.Service's ring
// handler) exchange them over the fake network (test/lab/fakegossip), and
// their own sent-bytes counters measure them, beside the whole state that
// periodic gossip carried before deltas and digests.
func gossipBytesRows(ctx context.Context, n int) (rows []benchtable.Row, err error) {
	tbl := &benchtable.Table{}
	defer func() { rows = tbl.Rows }()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	const cluster = "bench-cluster"
	record := func(i int, v uint64) membership.PeerRecord {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i / 250), byte(i%250 + 1)})
		// 10.128.0.0/9 as the masters lease it, then 10.0.0.0/9 beyond
		// 32,768 agents (a /8 overlay, as bench/scale sizes it there).
		second := (128 + i/256) % 256
		info := &api.AgentInfo{AgentID: owner(i), IP: ip.String(), MeshAddr: ip.String() + ":6783", Version: v,
			Overlays: []api.AgentOverlay{{Info: api.OverlayNetwork{Name: "carve"},
				Subnet:      fmt.Sprintf("10.%d.%d.0/24", second, i%256),
				MesosBridge: &api.BridgeInfo{IP: fmt.Sprintf("10.%d.%d.0/25", second, i%256)},
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
	gnet := fakegossip.New(fakegossip.Config{Seed: 1})
	defer gnet.Close()
	sent := &sentBytes{}
	hs := map[string]*membership.Handler{}
	chs := map[string]gossip.Channel{}
	for id, m := range map[string]*membership.Membership{"a": a, "b": b} {
		r, err := gnet.Join(id)
		if err != nil {
			return nil, err
		}
		hs[id] = membership.NewHandler(membership.HandlerConfig{Self: id, Members: m, ClusterID: func() string { return cluster },
			Merge: func(msg membership.Message) gossip.Data {
				if news := m.Merge(msg.State); len(news.Records)+len(news.Tombstones) > 0 {
					return membership.DeltaData(cluster, news, sent.add)
				}
				return nil
			},
			Unicast: func(dst string, msg []byte) error { return chs[id].Unicast(dst, msg) },
			Sent:    sent.add})
		if chs[id], err = r.Channel("carve-agents", hs[id]); err != nil {
			return nil, err
		}
	}
	idle := func() error { return gnet.WaitIdle(ctx) }
	round := func() (map[string]int, map[string]int, error) {
		sent.reset()
		chs["a"].Gossip(hs["a"].Gossip())
		err := idle()
		b, m := sent.reset()
		return b, m, err
	}
	// One change, broadcast: both then hold it.
	announced := record(n/3, uint64(100+n+1))
	a.MergeFromMasters(membership.State{Records: []membership.PeerRecord{announced}})
	sent.reset()
	chs["a"].Broadcast(membership.DeltaData(cluster, membership.State{Records: []membership.PeerRecord{announced}}, sent.add))
	if err := idle(); err != nil {
		return nil, err
	}
	delta, _ := sent.reset()
	equal, _, err := round()
	if err != nil {
		return nil, err
	}
	changed := record(n/2, uint64(100+n+2))
	a.MergeFromMasters(membership.State{Records: []membership.PeerRecord{changed}}) // no broadcast: b is behind
	oneOff, oneOffN, err := round()
	if err != nil {
		return nil, err
	}
	// The rounds until b is in sync again (the digest alone): one, up to
	// 10,000 agents; the row's note counts them.
	rounds := 1
	for ; ; rounds++ {
		_, again, err := round()
		if err != nil {
			return nil, err
		}
		if again["digest"] == 1 && len(again) == 1 {
			break
		}
		if rounds == 10 {
			return nil, fmt.Errorf("%d agents: 10 rounds did not reconcile the memberships (%v)", n, again)
		}
	}
	base := "whole membership (periodic gossip before)"
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, membership: one change, broadcast delta (%d agents)", n), Value: float64(delta["delta"]), Unit: "B/msg",
		Baseline: base, BaseVal: float64(len(whole))})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, membership: anti-entropy round, in sync (%d agents)", n), Value: float64(sum(equal)), Unit: "B/round",
		Baseline: base, BaseVal: float64(len(whole)), Note: "the digest alone"})
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, membership: anti-entropy round, one record behind (%d agents)", n), Value: float64(sum(oneOff)), Unit: "B/round",
		Baseline: base, BaseVal: float64(len(whole)), Note: fmt.Sprintf("digest %d + bucket hashes %d + push %d (%d messages); in sync after %d round(s)", oneOff["digest"], oneOff["buckets"], oneOff["push"], sum(oneOffN), rounds)})

	ringRows, signed, err := ringGossipRows(ctx, cluster, n, true)
	if err != nil {
		return nil, err
	}
	for _, r := range ringRows {
		tbl.Add(r)
	}
	_, unsigned, err := ringGossipRows(ctx, cluster, n, false)
	if err != nil {
		return nil, err
	}
	tbl.Add(benchtable.Row{Name: fmt.Sprintf("gossip, rings: one allocation's free count, signed claim (%d agents)", n), Value: signed, Unit: "B/msg",
		Baseline: "the same change unsigned (no claim keys), same run", BaseVal: unsigned,
		Note: "attributed claims: the writer's id and ed25519 signature on each entry; goal < 1 KB"})
	return nil, nil
}

// owner is synthetic agent i's id.
func owner(i int) string { return fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i) }

// sentBytes counts what handlers send, by kind.
type sentBytes struct {
	mu          sync.Mutex
	bytes, msgs map[string]int
}

func (s *sentBytes) add(kind string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bytes == nil {
		s.bytes, s.msgs = map[string]int{}, map[string]int{}
	}
	s.bytes[kind] += n
	s.msgs[kind]++
}

// reset returns the counts so far and starts over.
func (s *sentBytes) reset() (bytes, msgs map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bytes, msgs = s.bytes, s.msgs
	s.bytes, s.msgs = map[string]int{}, map[string]int{}
	return bytes, msgs
}

func sum(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

// ringGossipRows measures the ring channel's messages at n agents with two
// real ipam.Services (agents 0 and 1) whose views lease one /24 of one
// overlay to each of the n agents, on the fake network: what their own
// counters (Config.OnSent) count, beside the whole ring that was broadcast
// and pushed before deltas and bucketed digests. With signed, the two
// sign their claims and verify each other's (attributed claims); it
// returns the size of one allocation's broadcast delta too.
func ringGossipRows(ctx context.Context, cluster string, n int, signed bool) (rows []benchtable.Row, allocDelta float64, err error) {
	dir, err := os.MkdirTemp("", "carve-bench-rings-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	subnet := func(i int) string { return fmt.Sprintf("10.%d.%d.0/24", (128+i/256)%256, i%256) } // as record's
	// Attributed claims on: the two real agents sign what they write
	// with their claim keys, and each verifies the other's under the key
	// of its record.
	keys := make([]ed25519.PrivateKey, 2)
	for i := range keys {
		if !signed {
			break
		}
		if _, keys[i], err = ed25519.GenerateKey(rand.Reader); err != nil {
			return nil, 0, err
		}
	}
	var peers []ipam.Peer
	for i := range n {
		p := ipam.Peer{ID: owner(i), Version: uint64(100 + i), Subnets: []string{subnet(i)}}
		if i < len(keys) && keys[i] != nil {
			p.ClaimKey = keys[i].Public().(ed25519.PublicKey)
		}
		peers = append(peers, p)
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 2})
	defer gnet.Close()
	sent := &sentBytes{}
	svcs := make([]*ipam.Service, 2)
	views := make([]ipam.View, 2)
	chs := make([]gossip.Channel, 2)
	join := func(i int) error {
		r, err := gnet.Join(owner(i))
		if err != nil {
			return err
		}
		ch, err := r.Channel(ipam.RingChannel, svcs[i].RingGossip())
		if err != nil {
			return err
		}
		svcs[i].UseChannel(ch)
		chs[i] = ch
		return nil
	}
	for i := range svcs {
		db, err := bolt.Open(filepath.Join(dir, fmt.Sprintf("agent-%d.db", i)), 0o600, &bolt.Options{Timeout: 5 * time.Second})
		if err != nil {
			return nil, 0, err
		}
		defer db.Close()
		svc, err := ipam.New(ipam.Config{AgentID: owner(i), DB: db, Logger: slog.New(slog.DiscardHandler), OnSent: sent.add, ClaimKey: keys[i]})
		if err != nil {
			return nil, 0, err
		}
		self := &api.AgentInfo{AgentID: owner(i), IP: fmt.Sprintf("198.19.0.%d", i+1), Version: uint64(100 + i), Overlays: []api.AgentOverlay{{
			Info:        api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24},
			Subnet:      subnet(i),
			MesosBridge: &api.BridgeInfo{Name: "m-carve", IP: subnet(i)},
			State:       api.OverlayState{Status: api.StatusOK}}}}
		views[i] = ipam.View{ClusterID: cluster, Self: self, Network: &api.NetworkConfig{OverlayMTU: 1400}, Peers: peers}
		svc.Sync(views[i])
		svcs[i] = svc
		if err := join(i); err != nil {
			return nil, 0, err
		}
	}
	idle := func() error { return gnet.WaitIdle(ctx) }
	// announce has agent 0 announce what it wrote: a sync (of the same
	// view) ends with the announcement Run makes when gossip asks.
	announce := func() error {
		svcs[0].Sync(views[0])
		return idle()
	}
	round := func() (map[string]int, map[string]int, error) {
		if err := idle(); err != nil {
			return nil, nil, err
		}
		sent.reset()
		chs[0].Gossip(svcs[0].RingGossip().Gossip()) // agent 0's digest, as mesh gossips it
		err := idle()
		b, m := sent.reset()
		return b, m, err
	}
	// Each agent's own free counts, announced, then in sync.
	for i := range svcs {
		svcs[i].Sync(views[i])
	}
	if _, _, err := round(); err != nil {
		return nil, 0, err
	}
	whole := len(svcs[0].Rings()["carve/4"])
	base := "the whole ring (broadcast and pushed before)"

	// One allocation: the agent's free count, announced.
	if _, err := svcs[0].Allocate(api.IPAMRequest{Network: "carve", ContainerID: "bench-1", IfName: "eth0"}); err != nil {
		return nil, 0, err
	}
	sent.reset()
	if err := announce(); err != nil {
		return nil, 0, err
	}
	alloc, allocN := sent.reset()
	allocDelta = float64(alloc["delta"]) / float64(max(1, allocN["delta"]))
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: one allocation's free count, broadcast delta (%d agents)", n), Value: allocDelta, Unit: "B/msg",
		Baseline: base, BaseVal: float64(whole)})
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: a registration, per agent (%d agents)", n), Value: 0, Unit: "B/agent",
		Baseline: "each agent broadcast its changed ring before", BaseVal: float64(whole),
		Note: "every agent seeds the new lease from its own view"})

	// Anti-entropy: in sync, then one allocation behind (agent 1 away
	// while agent 0 announced it).
	inSync, _, err := round()
	if err != nil {
		return nil, 0, err
	}
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: anti-entropy round, in sync (%d agents)", n), Value: float64(sum(inSync)), Unit: "B/round",
		Baseline: base, BaseVal: float64(whole), Note: "the digest alone"})
	gnet.Leave(owner(1))
	if _, err := svcs[0].Allocate(api.IPAMRequest{Network: "carve", ContainerID: "bench-2", IfName: "eth0"}); err != nil {
		return nil, 0, err
	}
	sent.reset()
	if err := announce(); err != nil {
		return nil, 0, err
	}
	if err := join(1); err != nil {
		return nil, 0, err
	}
	oneOff, oneOffN, err := round()
	if err != nil {
		return nil, 0, err
	}
	if a, b := svcs[0].Rings()["carve/4"], svcs[1].Rings()["carve/4"]; string(a) != string(b) {
		return nil, 0, fmt.Errorf("%d agents: one ring anti-entropy round did not reconcile the rings", n)
	}
	rows = append(rows, benchtable.Row{Name: fmt.Sprintf("gossip, rings: anti-entropy round, one allocation behind (%d agents)", n), Value: float64(sum(oneOff)), Unit: "B/round",
		Baseline: base, BaseVal: float64(whole), Note: fmt.Sprintf("digest %d + bucket hashes %d + push %d (%d messages)", oneOff["digest"], oneOff["buckets"], oneOff["push"], sum(oneOffN))})
	return rows, allocDelta, nil
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
