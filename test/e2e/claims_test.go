package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// forgedRing is the claims a writer would make giving half of subnet to
// recipient, as if it leased subnet at version (signed with key; nil:
// unsigned).
func forgedRing(t *testing.T, universe, subnet netip.Prefix, writer, recipient string, version uint64, key ed25519.PrivateKey) []byte {
	t.Helper()
	a, err := ring.NewAllocator(writer, universe)
	if err != nil {
		t.Fatal(err)
	}
	if key != nil {
		a.SetSigner(func(msg []byte) []byte { return ed25519.Sign(key, msg) })
	}
	if _, err := a.SeedSets([]ring.LeaseSet{{Owner: writer, Version: version, Prefixes: []netip.Prefix{subnet}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Grant(recipient, netip.PrefixFrom(subnet.Addr(), subnet.Bits()+1)); err != nil {
		t.Fatal(err)
	}
	return a.Ring().Claims().Encode()
}

// TestForgedClaims replays attacks 1 and 2 of issue 19 against real
// agents and masters in network namespaces, with containers on every host:
//
//  1. a rogue mesh peer (carve-lab rogue-gossip, in host 3's namespace)
//     broadcasts hand-made ring entries giving half of host 2's lease to
//     host 3: with the mesh password only (unsigned, signed in host 2's
//     name with another key, a forged lease and tombstone), and as a
//     compromised host 1 with its own claim key (in host 2's lease; at a
//     version past its record);
//  2. host 1's agent certificate reports a grant of host 2's first lease
//     to itself.
//
// Each is refused and counted under its reason on every agent (403 at the
// masters), and nothing changes: every agent's peers and kernel (routes,
// neighbours, FDB) are as before, the masters' records too, and `carve
// ipam check` finds no duplicate.
func TestForgedClaims(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	live := containerPerHost(ctx, t, c)
	pingAll(ctx, t, live)
	st, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h1, h2, h3 := c.Host(1), c.Host(2), c.Host(3)
	record := func(st *api.State, id string) *api.AgentInfo {
		for i := range st.Agents {
			if st.Agents[i].AgentID == id {
				return &st.Agents[i]
			}
		}
		t.Fatalf("the masters have no record of %s", id)
		return nil
	}
	r1, r2 := record(st, h1.AgentID()), record(st, h2.AgentID())
	ov := r2.Overlay("carve")
	if ov == nil || st.ClusterID == "" {
		t.Fatalf("%s has no lease of overlay carve, or the masters no cluster id", h2.Name)
	}
	universe, subnet := netip.MustParsePrefix(ov.Info.Subnet), netip.MustParsePrefix(ov.Subnet)
	h1Key, err := c.ClaimKey(h1)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	before := hostViews(ctx, t, c)

	leaseRing := func() []byte {
		r, err := ring.NewRing(universe)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.SeedSets([]ring.LeaseSet{{Owner: h3.AgentID(), Version: 1<<32 - 1, Prefixes: []netip.Prefix{subnet}}},
			[]ring.Tombstone{{Owner: h2.AgentID(), Version: 1<<32 - 1}}); err != nil {
			t.Fatal(err)
		}
		return r.Encode()
	}
	refused := func(reason string) string {
		return `carve_agent_ring_claims_refused_total{reason="` + reason + `"}`
	}
	cases := []struct {
		name   string
		ring   []byte
		reason string
	}{
		{"mesh password only: unsigned, in host 2's name", forgedRing(t, universe, subnet, h2.AgentID(), h3.AgentID(), r2.Version, nil), "unsigned"},
		{"mesh password only: host 2's name, another key", forgedRing(t, universe, subnet, h2.AgentID(), h3.AgentID(), r2.Version, otherKey), "bad_signature"},
		{"mesh password only: a lease and a tombstone", leaseRing(), ring.RefusedLease},
		{"compromised host 1: its own key, host 2's lease", forgedRing(t, universe, subnet, h1.AgentID(), h3.AgentID(), r1.Version, h1Key), ring.RefusedNotLessee},
		{"compromised host 1: past its record's version", forgedRing(t, universe, subnet, h1.AgentID(), h3.AgentID(), 1<<31, h1Key), ring.RefusedRecordAhead},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		ok := t.Run(tc.name, func(t *testing.T) {
			data, err := labcluster.RingMessage(st.ClusterID, "carve", "4", tc.ring)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, fmt.Sprintf("ring-%d.json", i))
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			counts := map[string]float64{}
			for _, h := range c.Hosts() {
				if counts[h.Name], err = agentMetric(ctx, c, h, refused(tc.reason)); err != nil {
					t.Fatal(err)
				}
			}
			rogue, err := c.StartRingRogue(h3, fmt.Sprintf("ring-rogue-%d", i), true, file)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range c.Hosts() {
				err := retry.Until(ctx, 200*time.Millisecond, func() error {
					v, err := agentMetric(ctx, c, h, refused(tc.reason))
					if err == nil && v <= counts[h.Name] {
						err = fmt.Errorf("%s: %s still %v", h.Name, refused(tc.reason), v)
					}
					return err
				})
				if err != nil {
					t.Fatalf("the forged claims were not refused: %v\nrogue log:\n%s", err, rogue.Tail(20))
				}
			}
			if err := rogue.Stop(ctx, 0); err != nil {
				t.Error(err)
			}
			checkUnchanged(ctx, t, c, before)
		})
		if !ok {
			t.FailNow()
		}
	}

	t.Run("host 1 reports a grant of host 2's lease", func(t *testing.T) {
		cl, err := c.MasterClientAs(h1)
		if err != nil {
			t.Fatal(err)
		}
		half := netip.PrefixFrom(subnet.Addr(), subnet.Bits()+1).String()
		// Sent again while the masters answer 503 (an election on a loaded
		// machine), as an agent does; the refusal is what counts.
		testutil.Eventually(t, converge, "the forged grant report answered", func() error {
			_, err = cl.ReportGrant(ctx, h1.AgentID(), api.GrantReport{Overlay: "carve", Prefix: half, Donor: h2.AgentID(), Recipient: h1.AgentID()})
			if api.IsCode(err, api.CodeNoLeader) || api.IsCode(err, api.CodeUnavailable) {
				return err
			}
			return nil
		})
		var e *api.Error
		if !api.IsCode(err, api.CodeForbidden) || !errors.As(err, &e) || !strings.Contains(e.Message, "donor_signature") {
			t.Fatalf("forged grant report: %v; want 403 naming donor_signature", err)
		}
		after, err := c.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if a2 := record(after, h2.AgentID()); a2.Version != r2.Version || !reflect.DeepEqual(heldBlocks(a2), heldBlocks(r2)) {
			t.Errorf("%s's record changed: %+v, was %+v", h2.Name, heldBlocks(a2), heldBlocks(r2))
		}
		if slices.ContainsFunc(record(after, h1.AgentID()).Overlay("carve").Blocks, func(b api.Block) bool { return b.Prefix == half }) {
			t.Errorf("%s holds %s", h1.Name, half)
		}
		checkUnchanged(ctx, t, c, before)
	})

	// Nothing moved: every container still reaches every other, and no
	// address is held twice.
	pingAll(ctx, t, live)
	rep, code := ipamCheck(ctx, t, c)
	if code != 0 || !rep.Clean {
		t.Errorf("carve ipam check: exit %d, problems %+v; want clean", code, rep.Problems)
	}
	waitKernelMatchesMasters(ctx, t, c)
}

// heldBlocks is what a record leases, overlay by overlay: its blocks less
// the usage the agent reports (which changes with every report, forged
// claims or not).
func heldBlocks(a *api.AgentInfo) map[string][]api.Block {
	held := map[string][]api.Block{}
	for _, o := range a.Overlays {
		for _, b := range o.Blocks {
			b.Used, b.Free = nil, nil
			held[o.Info.Name] = append(held[o.Info.Name], b)
		}
	}
	return held
}
