package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// rotationsEnv sets how many key rotations TestEncryptionRotations makes
// (unset or 0: it is skipped). It is the soak that found the crossing
// handshakes of wireguard/rehandshake.go: run it beside busy loops, e.g.
// CARVE_WG_ROTATIONS=40 with two `while :; do :; done`.
const rotationsEnv = "CARVE_WG_ROTATIONS"

// TestEncryptionRotations rotates the WireGuard keys of two hosts in turn,
// CARVE_WG_ROTATIONS times, with pings from host 1 to host 2 throughout
// each rotation, and logs the longest gap between replies of each; no
// rotation may stop them for more than 3 s (what TestEncryption allows
// its one rotation). A failure names both devices' state.
func TestEncryptionRotations(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv(rotationsEnv))
	if err != nil || n <= 0 {
		t.Skipf("set %s to a number of rotations to run this soak", rotationsEnv)
	}
	ctx := within(t, converge*time.Duration(2+n/10))
	netCfg := state.DefaultConfig()
	netCfg.Encryption = api.EncryptionWireGuard
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, Network: &netCfg})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cts := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cts)
	for i := range n {
		h := c.Host(1 + i%2)
		before, err := c.Client().Agent(ctx, h.AgentID())
		if err != nil {
			t.Fatal(err)
		}
		p := startPinger(ctx, cts[0], cts[1].Addr.Addr())
		p.waitReplies(t, 5)
		if _, err := c.RunCarve(ctx, c.Host(1), append([]string{"agent", "rotate-wireguard-key", h.AgentID(),
			"--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)...); err != nil {
			p.stop()
			t.Fatal(err)
		}
		testutil.Eventually(t, converge, h.Name+"'s new key in its record", func() error {
			after, err := c.Client().Agent(ctx, h.AgentID())
			if err != nil {
				return err
			}
			if after.Keys.WireGuard == before.Keys.WireGuard {
				return fmt.Errorf("its record still carries its old key")
			}
			return nil
		})
		p.waitReplies(t, 20)
		gap, sent, replies := p.stop()
		t.Logf("rotation %d, of %s: %d echoes, %d replies, longest gap %s", i+1, h.Name, sent, replies, gap)
		if gap > 3*time.Second {
			t.Errorf("rotation %d, of %s: pings stopped for %s, want at most 3s (ending %s); the devices now:\n%s\n%s",
				i+1, h.Name, gap, p.gapEnd.Format("15:04:05.000"), wireGuardState(c.Host(1)), wireGuardState(c.Host(2)))
		}
	}
}
