package ipamwire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
)

// golden is one message's wire bytes as the release before this package
// encoded them (testdata/golden.json, written by agent/ipam's own encoders
// at 65163cf, before they moved here).
type golden struct {
	Name  string `json:"name"`
	Bytes []byte `json:"bytes"`
}

func readGolden(tb testing.TB) map[string][]byte {
	tb.Helper()
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		tb.Fatal(err)
	}
	var gs []golden
	if err := json.Unmarshal(b, &gs); err != nil {
		tb.Fatal(err)
	}
	out := map[string][]byte{}
	for _, g := range gs {
		out[g.Name] = g.Bytes
	}
	return out
}

// goldenKey is the claim key the golden messages are signed with.
func goldenKey(id string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("golden claim key of " + id))
	return ed25519.NewKeyFromSeed(seed[:])
}

// goldenMessages builds the golden file's messages with this package; the
// rings inside them (package ring's bytes, not this package's) come from
// the file.
func goldenMessages(tb testing.TB, want map[string][]byte) map[string][]byte {
	tb.Helper()
	whole, delta := want["ring whole"], want["ring delta"]
	if whole == nil || delta == nil {
		tb.Fatal("the golden file has no rings")
	}
	req := SpaceMessage{V: SpaceVersion, Kind: KindRequest, ClusterID: "c1", From: "a", ID: "a-00000000000000a1", Overlay: "carve", Family: "4", Bits: 27}
	SignSpaceRequest(goldenKey("a"), &req)
	g := Grant{Overlay: "carve", Prefix: netip.MustParsePrefix("10.128.0.112/28"), Donor: "b", Recipient: "a", RequestID: req.ID}
	expires, sig := SignGrant(goldenKey("b"), "c1", g, time.Unix(1800000000, 0).Add(-api.GrantLifetime))
	grant := SpaceMessage{V: SpaceVersion, Kind: KindGrant, ClusterID: "c1", From: "b", ID: req.ID, Overlay: "carve", Family: "4",
		Prefix: g.Prefix.String(), Ring: delta, Expires: expires, GrantSig: sig}
	refuse := SpaceMessage{V: SpaceVersion, Kind: KindRefuse, ClusterID: "c1", From: "c", ID: "a-00000000000000a2", Overlay: "carve", Family: "6", Reason: ReasonIPv6NotGranted}
	unsigned := SpaceMessage{V: SpaceVersion, Kind: KindRequest, From: "a", ID: "a-00000000000000a3", Overlay: "o-2", Family: "6", Bits: 64}
	hashes := make([]byte, 32)
	for i := range hashes {
		hashes[i] = byte(i * 7)
	}
	return map[string][]byte{
		"ring whole":                           whole,
		"ring delta":                           delta,
		"space request signing bytes":          SpaceRequestSigningBytes(req),
		"space request":                        EncodeSpaceMessage(req),
		"space grant":                          EncodeSpaceMessage(grant),
		"space grant statement signing bytes":  api.GrantSigningBytes(g.Report(expires, sig), "c1"),
		"space refuse":                         EncodeSpaceMessage(refuse),
		"space request unsigned":               EncodeSpaceMessage(unsigned),
		"space request unsigned signing bytes": SpaceRequestSigningBytes(unsigned),
		"ring broadcast":                       EncodeRingMessage(RingMessage{ClusterID: "c1", Rings: []RingEntry{{Overlay: "carve", Family: "4", Ring: delta}}}),
		"ring digest": EncodeRingMessage(RingMessage{ClusterID: "c1", From: "a", Digest: []RingDigest{
			{Overlay: "carve", Family: "4", Hash: 0x0123456789abcdef}, {Overlay: "carve", Family: "6", Hash: 1}}}),
		"ring buckets":    EncodeRingMessage(RingMessage{ClusterID: "c1", From: "b", Buckets: []RingBuckets{{Overlay: "carve", Family: "4", Hashes: hashes}}}),
		"ring push":       EncodeRingMessage(RingMessage{ClusterID: "c1", Rings: []RingEntry{{Overlay: "carve", Family: "4", Ring: whole, N: 4, Buckets: []int{1, 3}}}}),
		"ring no cluster": EncodeRingMessage(RingMessage{Rings: []RingEntry{{Overlay: "carve", Family: "6", Ring: whole}}}),
	}
}

// TestGoldenWireBytes: this package encodes, and signs, every message as
// the release before it did, byte for byte (agents of that release read
// and verify them), and decodes what that release sent.
func TestGoldenWireBytes(t *testing.T) {
	want := readGolden(t)
	got := goldenMessages(t, want)
	if len(got) != len(want) {
		t.Errorf("%d messages built, the golden file has %d", len(got), len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s: not built", name)
		case !bytes.Equal(g, w):
			t.Errorf("%s: the wire bytes changed:\ngot  %s\nwant %s", name, g, w)
		}
	}
	// Each of the previous release's messages decodes, and encodes back
	// to its bytes.
	space := func(b []byte) ([]byte, error) { m, err := DecodeSpaceMessage(b); return EncodeSpaceMessage(m), err }
	rings := func(b []byte) ([]byte, error) { m, err := DecodeRingMessage(b); return EncodeRingMessage(m), err }
	for _, tt := range []struct {
		names []string
		again func([]byte) ([]byte, error)
	}{
		{[]string{"space request", "space grant", "space refuse", "space request unsigned"}, space},
		{[]string{"ring broadcast", "ring digest", "ring buckets", "ring push", "ring no cluster"}, rings},
	} {
		for _, name := range tt.names {
			again, err := tt.again(want[name])
			switch {
			case err != nil:
				t.Errorf("%s: the previous release's message is refused: %v", name, err)
			case !bytes.Equal(again, want[name]):
				t.Errorf("%s: decoded and encoded again, the bytes differ", name)
			}
		}
	}
}

// TestGoldenSignaturesVerify: the previous release's signed request and
// grant statement verify here, under the signer's key only, and a change
// of any signed field breaks them.
func TestGoldenSignaturesVerify(t *testing.T) {
	want := readGolden(t)
	req, err := DecodeSpaceMessage(want["space request"])
	if err != nil {
		t.Fatal(err)
	}
	pubA := goldenKey("a").Public().(ed25519.PublicKey)
	pubB := goldenKey("b").Public().(ed25519.PublicKey)
	if err := VerifySpaceRequest(pubA, req); err != nil {
		t.Errorf("the signed request: %v", err)
	}
	if err := VerifySpaceRequest(pubB, req); err == nil {
		t.Error("the request verifies under another agent's key")
	}
	tampered := req
	tampered.Bits = 26
	if err := VerifySpaceRequest(pubA, tampered); err == nil {
		t.Error("a request asking for more than was signed verifies")
	}
	unsigned, err := DecodeSpaceMessage(want["space request unsigned"])
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySpaceRequest(pubA, unsigned); err != ErrUnsigned {
		t.Errorf("an unsigned request: %v, want ErrUnsigned", err)
	}
	ans, err := DecodeSpaceMessage(want["space grant"])
	if err != nil {
		t.Fatal(err)
	}
	g := Grant{Overlay: ans.Overlay, Prefix: ans.GrantedPrefix(), Donor: ans.From, Recipient: "a", RequestID: ans.ID}
	before := time.Unix(ans.Expires-1, 0)
	if err := VerifyGrant(pubB, "c1", g, ans, before); err != nil {
		t.Errorf("the grant statement: %v", err)
	}
	for _, tt := range []struct {
		name, cluster, recipient string
		key                      ed25519.PublicKey
	}{
		{"another recipient", "c1", "c", pubB},
		{"another cluster", "c2", "a", pubB},
		{"another signer's key", "c1", "a", pubA},
	} {
		g := g
		g.Recipient = tt.recipient
		if err := VerifyGrant(tt.key, tt.cluster, g, ans, before); err == nil {
			t.Errorf("a grant statement with %s verifies", tt.name)
		}
	}
	if err := VerifyGrant(pubB, "c1", g, ans, time.Unix(ans.Expires, 0)); err == nil {
		t.Error("an expired grant statement verifies")
	}
	if err := VerifyGrant(nil, "c1", g, ans, before); err == nil {
		t.Error("a grant statement verifies without the donor's key")
	}
}
