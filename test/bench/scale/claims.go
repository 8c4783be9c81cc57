package main

// Attributed claims at scale: the synthetic agents register claim keys, as
// real agents do, and the real agent is handed, once, the signed ring
// claims their gossip would have brought (each agent's free count after
// one allocation, signed with its claim key), so that it verifies and
// holds thousands of writers' claims while its idle CPU and registration
// to programmed are measured.

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// syntheticPrefix starts every synthetic agent's id.
const syntheticPrefix = "syn-"

// claimKeyOf is synthetic agent i's claim key, derived from i.
func claimKeyOf(i int) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("bench/scale claim key " + strconv.Itoa(i)))
	return ed25519.NewKeyFromSeed(seed[:])
}

// claimKeys is what synthetic agent i registers.
func claimKeys(i int) api.AgentKeys {
	return api.AgentKeys{Claim: base64.StdEncoding.EncodeToString(claimKeyOf(i).Public().(ed25519.PublicKey))}
}

// signedClaimsMessage is the ring message holding, for every synthetic
// agent of st, the claims it writes after one allocation in its mesos
// bridge (its free count), signed with its claim key, as the ring package
// of each agent would write them; it returns how many agents wrote.
func signedClaimsMessage(st *api.State) ([]byte, int, error) {
	if len(st.Network.Overlays) == 0 {
		return nil, 0, errors.New("the masters' state has no overlay")
	}
	ov := st.Network.Overlays[0]
	universe, err := netip.ParsePrefix(ov.Subnet)
	if err != nil {
		return nil, 0, fmt.Errorf("overlay %s: %w", ov.Name, err)
	}
	type writer struct {
		key    ed25519.PrivateKey
		set    ring.LeaseSet
		bridge netip.Prefix
	}
	var writers []writer
	var sets []ring.LeaseSet
	for _, a := range st.Agents {
		i, err := strconv.Atoi(strings.TrimPrefix(a.AgentID, syntheticPrefix))
		ao := a.Overlay(ov.Name)
		if !strings.HasPrefix(a.AgentID, syntheticPrefix) || err != nil || ao == nil || ao.MesosBridge == nil {
			continue
		}
		set := ring.LeaseSet{Owner: a.AgentID, Version: a.Version}
		for _, s := range leasePrefixes(ao) {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
				set.Prefixes = append(set.Prefixes, p)
			}
		}
		bridge, err := netip.ParsePrefix(ao.MesosBridge.IP)
		if err != nil {
			return nil, 0, fmt.Errorf("%s's mesos bridge: %w", a.AgentID, err)
		}
		writers = append(writers, writer{key: claimKeyOf(i), set: set, bridge: bridge.Masked()})
		sets = append(sets, set)
	}
	all, err := ring.NewAllocator("bench-feeder", universe)
	if err != nil {
		return nil, 0, err
	}
	if _, err := all.SeedSets(sets, nil); err != nil {
		return nil, 0, err
	}
	claims := make([]*ring.Ring, 0, len(writers))
	for _, w := range writers {
		a, err := ring.NewAllocator(w.set.Owner, universe)
		if err != nil {
			return nil, 0, err
		}
		key := w.key
		a.SetSigner(func(msg []byte) []byte { return ed25519.Sign(key, msg) })
		if _, err := a.SeedSets([]ring.LeaseSet{w.set}, nil); err != nil {
			return nil, 0, fmt.Errorf("%s: %w", w.set.Owner, err)
		}
		if _, err := a.Allocate(ring.Attachment{ContainerID: "bench", Interface: "eth0"}, w.bridge); err != nil {
			return nil, 0, fmt.Errorf("%s allocates: %w", w.set.Owner, err)
		}
		if _, err := a.SyncFree(); err != nil {
			return nil, 0, fmt.Errorf("%s's free count: %w", w.set.Owner, err)
		}
		claims = append(claims, a.Ring().Claims())
	}
	// The claims joined pairwise, a tree of joins: a join costs the size
	// of both rings, so joining them one by one into the feeder's ring cost
	// the square of their number (minutes at 50,000).
	for len(claims) > 1 {
		next := claims[:0:0]
		for i := 0; i < len(claims); i += 2 {
			if i+1 < len(claims) {
				if _, err := claims[i].Merge(claims[i+1]); err != nil {
					return nil, 0, fmt.Errorf("join the claims: %w", err)
				}
			}
			next = append(next, claims[i])
		}
		claims = next
	}
	if len(claims) == 1 {
		if _, err := all.Merge(claims[0]); err != nil {
			return nil, 0, fmt.Errorf("the synthetic agents' claims: %w", err)
		}
	}
	msg, err := labcluster.RingMessage(st.ClusterID, ov.Name, "4", all.Ring().Claims().Encode())
	return msg, len(writers), err
}

// leasePrefixes are the prefixes an agent leases in an overlay: its blocks,
// or its subnets when the record lists none.
func leasePrefixes(ao *api.AgentOverlay) []string {
	if len(ao.Blocks) == 0 {
		return []string{ao.Subnet, ao.Subnet6}
	}
	var out []string
	for _, b := range ao.Blocks {
		out = append(out, b.Prefix)
	}
	return out
}

// Metrics of the real agent's ring gossip.
const (
	ringNews        = `carve_agent_ring_gossip_messages_total{result="news"}`
	claimsRefused   = "carve_agent_ring_claims_refused_total"
	feederBroadcast = 3 // times the feeder sends its message (the first may precede its connection)
)

// feedClaims hands the real agent on h the synthetic agents' signed claims
// through a mesh peer in host 2's namespace, waits until the agent merged
// them with none refused, and returns how many agents wrote them, the
// message's size and the real agent's CPU seconds from before the first
// broadcast until it had merged them.
func feedClaims(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host) (writers, size int, cpu float64, err error) {
	st, err := c.Client().State(ctx, apiclient.StateOptions{Consistent: true})
	if err != nil {
		return 0, 0, 0, err
	}
	msg, writers, err := signedClaimsMessage(st)
	if err != nil {
		return 0, 0, 0, err
	}
	file := filepath.Join(c.Dir, "signed-claims.json")
	if err := os.WriteFile(file, msg, 0o600); err != nil {
		return 0, 0, 0, err
	}
	hc, base := c.HTTPClient(), h.AgentURL()
	news, err := labcluster.MetricSample(ctx, hc, base, ringNews)
	if err != nil {
		return 0, 0, 0, err
	}
	refused, err := labcluster.MetricSum(ctx, hc, base, claimsRefused)
	if err != nil {
		return 0, 0, 0, err
	}
	before, err := cpuSeconds(h.Agent.PID())
	if err != nil {
		return 0, 0, 0, err
	}
	if _, err := c.StartRingFeeder(c.Host(2), "claims-feeder", file, feederBroadcast); err != nil {
		return 0, 0, 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := retry.Until(wctx, 100*time.Millisecond, func() error {
		now, err := labcluster.MetricSample(wctx, hc, base, ringNews)
		if err != nil {
			return err
		}
		if now <= news {
			return errors.New("the agent has merged no news from the feeder yet")
		}
		return nil
	}); err != nil {
		return 0, 0, 0, fmt.Errorf("the real agent merges %d agents' signed claims: %w", writers, err)
	}
	after, err := cpuSeconds(h.Agent.PID())
	if err != nil {
		return 0, 0, 0, err
	}
	if now, err := labcluster.MetricSum(ctx, hc, base, claimsRefused); err != nil || now != refused {
		return 0, 0, 0, fmt.Errorf("the real agent refused %v of the synthetic agents' signed claims (%v)", now-refused, err)
	}
	return writers, len(msg), after - before, nil
}
