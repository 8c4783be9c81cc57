package api

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
)

func sampleRecord() *AgentInfo {
	return &AgentInfo{
		AgentID: "a1", Hostname: "h1", IP: "198.18.0.1", MeshAddr: "198.18.0.1:6783", Version: 42,
		Keys: AgentKeys{Claim: "Y2xhaW0ta2V5LW9mLWExLXRoaXJ0eS10d28tYnl0ZXM=", WireGuard: "d2lyZWd1YXJkLWtleS1vZi1hMS0zMi1ieXRlcy0hISE="},
		UnderlayMTU: 9000,
		Overlays: []AgentOverlay{
			{Info: OverlayNetwork{Name: "six"}, Subnet6: "fd00::/64", State: OverlayState{Status: StatusOK},
				MesosBridge: &BridgeInfo{Name: "m-six", IP6: "fd00::/65"}},
			{Info: OverlayNetwork{Name: "carve"}, Subnet: "10.128.0.0/24", State: OverlayState{Status: StatusOK},
				MesosBridge:  &BridgeInfo{Name: "m-carve", IP: "10.128.0.0/25"},
				DockerBridge: &BridgeInfo{Name: "d-carve", IP: "10.128.0.128/25"},
				Backend:      &BackendInfo{VXLAN: &VXLANInfo{VNI: 1024, VTEPIP: "100.64.0.1/16", VTEPMAC: "70:b3:d5:00:00:01", VTEPIP6: "fd01:a::1/64"}},
				Blocks: []Block{
					{Bridge: BridgeMesos, Prefix: "10.128.9.0/25", Origin: BlockGrown, Version: 40},
					{Bridge: BridgeMesos, Prefix: "10.128.0.0/25", Origin: BlockLeased, Version: 7},
					{Bridge: BridgeDocker, Prefix: "10.128.0.128/25", Origin: BlockLeased, Version: 7},
					{Bridge: BridgeMesos, Prefix: "10.128.5.32/27", Origin: BlockGranted, Donor: "a9", Version: 41},
				}},
		},
	}
}

// The signed encoding is pinned: the masters and every agent version must
// agree on it byte for byte, so a change is a new format version.
func TestSigningBytesGolden(t *testing.T) {
	tests := []struct {
		name string
		msg  []byte
		want string // sha256
	}{
		{"record", RecordSigningBytes(sampleRecord(), "c1"), "1239bc902b3422f73c974bfef0475fc30197d0a9fc5e3b8cde692a5998937e5d"},
		{"tombstone", TombstoneSigningBytes(Tombstone{AgentID: "a1", Version: 43}, "c1"), "d403d7e6508575bca7bf4e94bc8a53d21d688403f229db627c0febc7547688ca"},
	}
	for _, tt := range tests {
		sum := sha256.Sum256(tt.msg)
		if got := hex.EncodeToString(sum[:]); got != tt.want {
			t.Errorf("%s: sha256 of the signed bytes %s, want %s\n%q", tt.name, got, tt.want, tt.msg)
		}
	}
}

// Fields are length-prefixed: moving bytes between adjacent fields, or
// leaving out unsigned ones, changes what is signed only as documented.
func TestSigningBytesUnambiguous(t *testing.T) {
	a, b := sampleRecord(), sampleRecord()
	a.AgentID, a.IP = "a1", "98.18.0.1"
	b.AgentID, b.IP = "a11", "8.18.0.1"
	if bytes.Equal(RecordSigningBytes(a, "c"), RecordSigningBytes(b, "c")) {
		t.Error("moving a byte from ip to agent_id signs the same bytes")
	}
	unsigned := sampleRecord()
	unsigned.Hostname, unsigned.NetworkConfig.DockerBridge = "other", true
	unsigned.Overlays[1].Backend.VXLAN.VNI = 7
	unsigned.Overlays[1].State = OverlayState{Status: StatusFailed, Error: "informational"}
	unsigned.ConfigurationAttempts = 9
	unsigned.NotLeased = []NotLeased{{Name: "x", Reason: "exhausted"}}
	used, free := uint64(3), uint64(120)
	unsigned.Overlays[1].Blocks[0].Used, unsigned.Overlays[1].Blocks[0].Free = &used, &free
	// The blocks are signed in their sorted order, whatever order they travel in.
	slices.Reverse(unsigned.Overlays[1].Blocks)
	if !bytes.Equal(RecordSigningBytes(sampleRecord(), "c"), RecordSigningBytes(unsigned, "c")) {
		t.Error("a change outside the signed fields changed the signed bytes")
	}
	for name, change := range map[string]func(*AgentInfo){
		"keys.claim":     func(a *AgentInfo) { a.Keys.Claim = "" },
		"keys.wireguard": func(a *AgentInfo) { a.Keys.WireGuard = a.Keys.Claim },
		"underlay_mtu":   func(a *AgentInfo) { a.UnderlayMTU = 1500 },
	} {
		changed := sampleRecord()
		change(changed)
		if bytes.Equal(RecordSigningBytes(sampleRecord(), "c"), RecordSigningBytes(changed, "c")) {
			t.Errorf("%s is not signed", name)
		}
	}
	v6 := sampleRecord()
	v6.Overlays[1].Backend.VXLAN.VTEPIP6 = "fd01:a::2/64"
	if bytes.Equal(RecordSigningBytes(sampleRecord(), "c"), RecordSigningBytes(v6, "c")) {
		t.Error("vtep_ip6 is not signed")
	}
	for i, change := range []func(*Block){
		func(b *Block) { b.Bridge = BridgeDocker },
		func(b *Block) { b.Prefix = "10.128.9.0/26" },
		func(b *Block) { b.Origin = BlockGranted },
		func(b *Block) { b.Donor = "a8" },
		func(b *Block) { b.Version++ },
	} {
		changed := sampleRecord()
		change(&changed.Overlays[1].Blocks[0])
		if bytes.Equal(RecordSigningBytes(sampleRecord(), "c"), RecordSigningBytes(changed, "c")) {
			t.Errorf("block change %d signs the same bytes", i)
		}
	}
	extra := sampleRecord()
	extra.Overlays[0].Blocks = []Block{{Bridge: BridgeMesos, Prefix: "fd00::/65", Origin: BlockLeased, Version: 7}}
	if bytes.Equal(RecordSigningBytes(sampleRecord(), "c"), RecordSigningBytes(extra, "c")) {
		t.Error("an added block signs the same bytes")
	}
	if bytes.Equal(TombstoneSigningBytes(Tombstone{AgentID: "a1", Version: 1}, "c"), TombstoneSigningBytes(Tombstone{AgentID: "a1", Version: 2}, "c")) {
		t.Error("tombstone versions sign alike")
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := sampleRecord()
	rec.Signature = Sign(key, RecordSigningBytes(rec, "c1"))
	if err := VerifyRecord(pub, rec, "c1"); err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseSigningKey(EncodeSigningKey(pub))
	if err != nil || !parsed.Equal(pub) {
		t.Fatalf("signing key round trip: %v", err)
	}
	for _, bad := range []string{"", "!!", "c2lnbg=="} {
		r := sampleRecord()
		r.Signature = bad
		if err := VerifyRecord(pub, r, "c1"); !errors.Is(err, ErrBadSignature) {
			t.Errorf("signature %q: %v", bad, err)
		}
	}
	if err := VerifyRecord(nil, rec, "c1"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("no key: %v", err)
	}
	if _, err := ParseSigningKey("c2lnbg=="); err == nil {
		t.Error("a 5-byte key parsed")
	}
}
