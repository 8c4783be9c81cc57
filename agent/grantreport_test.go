package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// TestGrantReportRefusedForGood: the masters' answers to a recipient's
// grant report, as its outbox acts on them (masterBlocks.ReportGrant, a
// secure master, agent certificates): a donor's statement that expired is
// refused for good (dropped, or it would block every later report);
// without one the 403 is kept (the report is sent again); a grant the
// table refuses (409) is refused for good.
func TestGrantReportRefusedForGood(t *testing.T) {
	ms := mastertest.StartSecure(t, filepath.Join(t.TempDir(), "m1"), state.DefaultConfig(), quietLogger())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	blocks := map[string]*masterBlocks{}
	subnet := map[string]string{}
	for i, id := range []string{"donor", "recipient"} {
		ip := netip.AddrFrom4([4]byte{198, 18, 9, byte(i + 1)})
		ms.CA.IssueAgent(id, ip)
		cl, err := apiclient.NewClientWith([]string{ms.URL()}, apiclient.ClientOptions{TLS: ms.CA.ClientTLS(id, pki.RoleAgent)})
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := testKey(t)
		info, err := cl.Register(ctx, api.RegisterRequest{AgentID: id, IP: ip.String(), NetworkConfig: api.AgentNetworkConfig{MesosBridge: true},
			Keys: api.AgentKeys{Claim: base64.StdEncoding.EncodeToString(pub)}})
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
		blocks[id], subnet[id] = &masterBlocks{id: id, client: cl}, info.Overlays[0].Subnet
	}
	half := netip.MustParsePrefix(subnet["donor"])
	half = netip.PrefixFrom(half.Addr(), half.Bits()+1)
	tests := []struct {
		name     string
		reporter string
		report   ipam.GrantReport
		forGood  bool
	}{
		{"the donor's statement expired", "recipient", ipam.GrantReport{Donor: "donor", Recipient: "recipient", Prefix: half,
			Expires: time.Now().Add(-time.Hour).Unix(), DonorSignature: "c2lnbmF0dXJl"}, true},
		{"no statement", "recipient", ipam.GrantReport{Donor: "donor", Recipient: "recipient", Prefix: half}, false},
		// A donor may report its grants; this one names free space, not
		// its own, which the table refuses (409).
		{"a grant of space the donor does not hold", "recipient", ipam.GrantReport{Donor: "recipient", Recipient: "donor",
			Prefix: netip.MustParsePrefix("10.255.255.0/25")}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.report
			g.Overlay, g.RequestID = "carve", fmt.Sprintf("req-%d", i)
			err := blocks[tt.reporter].ReportGrant(ctx, g)
			if err == nil {
				t.Fatal("the report was recorded")
			}
			if got := errors.Is(err, ipam.ErrReportRefused); got != tt.forGood {
				t.Errorf("refused for good: %v, want %v (%v)", got, tt.forGood, err)
			}
		})
	}
}
