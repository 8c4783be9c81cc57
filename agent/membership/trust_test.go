package membership

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/membershiptest"
)

// testKey is an ed25519 key pair for signing records in tests.
func testKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	return membershiptest.Key(t)
}

// signedPeer is membershiptest.SignedAgent's record, as gossip carries it.
func signedPeer(key ed25519.PrivateKey, cluster string, mutate ...func(*api.AgentInfo)) PeerRecord {
	return NewPeerRecord(membershiptest.SignedAgent(key, cluster, mutate...))
}

func signedTombstone(key ed25519.PrivateKey, cluster, id string, v uint64) api.Tombstone {
	return membershiptest.SignedTombstone(key, cluster, id, v)
}

// TestPeerRecordCarriesTheSignature: a record made from a signed master
// record, sent through gossip's encoding, verifies with the masters' key
// whatever the order of its overlays; any change of a field it carries
// does not.
func TestPeerRecordCarriesTheSignature(t *testing.T) {
	pub, priv := testKey(t)
	twoOverlays := func(a *api.AgentInfo) {
		a.Overlays = append(a.Overlays, api.AgentOverlay{Info: api.OverlayNetwork{Name: "aaa"}, Subnet6: "fd00:1::/64",
			MesosBridge: &api.BridgeInfo{Name: "m-aaa", IP6: "fd00:1::/65"}, State: api.OverlayState{Status: api.StatusFailed}})
	}
	withKeys := func(a *api.AgentInfo) {
		a.Keys = api.AgentKeys{Claim: base64.StdEncoding.EncodeToString(make([]byte, 32)), WireGuard: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))}
		a.UnderlayMTU = 9000
	}
	r := signedPeer(priv, "c1", twoOverlays, withKeys)
	if names := []string{r.Overlays[0].Name, r.Overlays[1].Name}; !slices.Equal(names, []string{"aaa", "carve"}) {
		t.Errorf("overlays in order %v, want sorted by name", names)
	}
	wire, err := json.Marshal(Message{ClusterID: "c1", State: State{Records: []PeerRecord{r}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, unsigned := range []string{"unsigned-host", "vtep1024", "4789", "1450", "m-carve"} {
		if strings.Contains(string(wire), unsigned) {
			t.Errorf("gossip carries the unsigned %q: %s", unsigned, wire)
		}
	}
	msg, err := Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	got := msg.Records[0]
	if err := api.VerifyRecord(pub, got.signedInfo(), "c1"); err != nil {
		t.Fatalf("the gossiped record does not verify: %v", err)
	}
	if ip, mac := got.VTEP(); ip != "100.64.0.2/16" || mac != "70:b3:d5:40:00:02" || !slices.Equal(got.Subnets(), []string{"fd00:1::/64", "10.128.2.0/24"}) {
		t.Errorf("derived vtep %s %s, subnets %v", ip, mac, got.Subnets())
	}
	swapped := got
	swapped.Overlays = []PeerOverlay{got.Overlays[1], got.Overlays[0]}
	if err := api.VerifyRecord(pub, swapped.signedInfo(), "c1"); err != nil {
		t.Errorf("overlays in another order: %v", err)
	}
	changes := map[string]func(*PeerRecord){
		"id":            func(p *PeerRecord) { p.ID = "c" },
		"ip":            func(p *PeerRecord) { p.IP = "198.18.0.12" },
		"mesh address":  func(p *PeerRecord) { p.MeshAddr = "198.18.0.11:6784" },
		"version":       func(p *PeerRecord) { p.Version++ },
		"subnet":        func(p *PeerRecord) { p.Overlays[1].Subnet = "10.128.3.0/24" },
		"subnet6":       func(p *PeerRecord) { p.Overlays[0].Subnet6 = "fd00:2::/64" },
		"vtep ip6":      func(p *PeerRecord) { p.Overlays[1].VTEPIP6 = "fd01:a::3/64" },
		"overlay name":  func(p *PeerRecord) { p.Overlays[0].Name = "bbb" },
		"mesos bridge":  func(p *PeerRecord) { p.Overlays[1].MesosIP = "10.128.2.0/26" },
		"docker bridge": func(p *PeerRecord) { p.Overlays[1].DockerIP6 = "fd00::/65" },
		"vtep ip":       func(p *PeerRecord) { p.Overlays[1].VTEPIP = "100.64.0.3/16" },
		"vtep mac":      func(p *PeerRecord) { p.Overlays[1].VTEPMAC = "70:b3:d5:40:00:03" },
		"overlay gone":  func(p *PeerRecord) { p.Overlays = p.Overlays[1:] },
		"overlay added": func(p *PeerRecord) { p.Overlays = append(p.Overlays, PeerOverlay{Name: "zzz"}) },
		"signature":     func(p *PeerRecord) { p.Signature = signedPeer(priv, "c1").Signature },
		"claim key":     func(p *PeerRecord) { p.Keys.Claim = p.Keys.WireGuard },
		"wireguard key": func(p *PeerRecord) { p.Keys.WireGuard = "" },
		"underlay mtu":  func(p *PeerRecord) { p.UnderlayMTU = 1500 },
	}
	for name, change := range changes {
		p := got
		p.Overlays = slices.Clone(got.Overlays)
		change(&p)
		if err := api.VerifyRecord(pub, p.signedInfo(), "c1"); !errors.Is(err, api.ErrBadSignature) {
			t.Errorf("changed %s: verify = %v, want a bad signature", name, err)
		}
	}
	if err := api.VerifyRecord(pub, got.signedInfo(), "c2"); !errors.Is(err, api.ErrBadSignature) {
		t.Errorf("another cluster id: verify = %v, want a bad signature", err)
	}
}

func TestRecordInRange(t *testing.T) {
	network := state.DefaultConfig()
	network.Overlays = append(network.Overlays, api.OverlayNetwork{Name: "six", Subnet6: "fd00::/48", Prefix6: 64})
	overlay := func(f func(*PeerOverlay)) func(*PeerRecord) { return func(p *PeerRecord) { f(&p.Overlays[0]) } }
	network6 := network
	network6.VTEPSubnet6 = "fd01:a::/64"
	tests := []struct {
		name    string
		change  func(*PeerRecord)
		network *api.NetworkConfig
		want    string // "" : in range
	}{
		{"as the masters render it", nil, &network, ""},
		{"an IPv6 overlay", func(p *PeerRecord) {
			p.Overlays = append(p.Overlays, PeerOverlay{Name: "six", Subnet6: "fd00:0:0:7::/64", MesosIP6: "fd00:0:0:7::/65"})
		}, &network, ""},
		{"a smaller block inside the overlay", overlay(func(o *PeerOverlay) { o.Subnet, o.MesosIP, o.DockerIP = "10.200.0.0/28", "", "" }), &network, ""},
		{"no network configuration known", nil, nil, "no network configuration"},
		{"overlay not configured", overlay(func(o *PeerOverlay) { o.Name = "other" }), &network, `overlay "other" is not in the network configuration`},
		{"subnet outside the overlay", overlay(func(o *PeerOverlay) { o.Subnet = "192.168.0.0/24" }), &network, "subnet 192.168.0.0/24 is outside"},
		{"subnet larger than the overlay", overlay(func(o *PeerOverlay) { o.Subnet = "0.0.0.0/0" }), &network, "subnet 0.0.0.0/0 is outside"},
		{"half the internet", overlay(func(o *PeerOverlay) { o.Subnet = "128.0.0.0/1" }), &network, "is outside"},
		{"IPv6 subnet in an IPv4 overlay", overlay(func(o *PeerOverlay) { o.Subnet6 = "fd00::/64" }), &network, "subnet6 fd00::/64 is outside"},
		{"bridge outside the subnet", overlay(func(o *PeerOverlay) { o.MesosIP = "10.128.3.0/25" }), &network, "mesos bridge 10.128.3.0/25 is outside"},
		{"vtep outside vtep_subnet", overlay(func(o *PeerOverlay) { o.VTEPIP, o.VTEPMAC = "198.18.0.1/16", "70:b3:d5:12:00:01" }), &network, "outside vtep_subnet"},
		{"vtep with another prefix length", overlay(func(o *PeerOverlay) { o.VTEPIP = "100.64.0.2/24" }), &network, "outside vtep_subnet"},
		{"mac not derived", overlay(func(o *PeerOverlay) { o.VTEPMAC = "70:b3:d5:40:00:09" }), &network, "is not 70:b3:d5:40:00:02, derived"},
		{"mac of another oui", overlay(func(o *PeerOverlay) { o.VTEPMAC = "02:00:00:40:00:02" }), &network, "is not 70:b3:d5:40:00:02"},
		{"vtep ip6 inside vtep_subnet6", overlay(func(o *PeerOverlay) { o.VTEPIP6 = "fd01:a::2/64" }), &network6, ""},
		{"vtep ip6 outside vtep_subnet6", overlay(func(o *PeerOverlay) { o.VTEPIP6 = "fd01:c::2/64" }), &network6, "outside vtep_subnet6"},
		{"vtep ip6 with another prefix length", overlay(func(o *PeerOverlay) { o.VTEPIP6 = "fd01:a::2/80" }), &network6, "outside vtep_subnet6"},
		{"vtep ip6 without vtep_subnet6", overlay(func(o *PeerOverlay) { o.VTEPIP6 = "fd01:a::2/64" }), &network, "outside vtep_subnet6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := signedPeer(nil, "")
			if tt.change != nil {
				tt.change(&r)
			}
			err := recordInRange(&r, tt.network)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("recordInRange = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestTrustAdmit: what gossip (or the masters' state) brings is split into
// what verifies and lies in range, and what is refused, by reason.
func TestTrustAdmit(t *testing.T) {
	pub, priv := testKey(t)
	_, other := testKey(t)
	network := state.DefaultConfig()
	signed := Trust{ClusterID: "c1", Key: pub, Required: true, Network: &network}
	// During a rotation of the signing key, to next from pub.
	nextPub, nextPriv := testKey(t)
	rotating := Trust{ClusterID: "c1", Key: nextPub, Previous: []ed25519.PublicKey{pub}, Required: true, Network: &network}
	rotated := Trust{ClusterID: "c1", Key: nextPub, Required: true, Network: &network}
	good := signedPeer(priv, "c1")
	changedSubnet := good
	changedSubnet.Overlays = slices.Clone(good.Overlays)
	changedSubnet.Overlays[0].Subnet = "10.128.9.0/24"
	bumped := good
	bumped.Version = math.MaxUint64
	tests := []struct {
		name    string
		tr      Trust
		cluster string
		st      State
		want    []string // refusal reasons, in order (tombstones first); the rest is admitted
	}{
		{"signed record", signed, "c1", State{Records: []PeerRecord{good}}, nil},
		{"signed tombstone", signed, "c1", State{Tombstones: []api.Tombstone{signedTombstone(priv, "c1", "b", 10)}}, nil},
		{"unsigned record", signed, "c1", State{Records: []PeerRecord{signedPeer(nil, "")}}, []string{RefusedUnsigned}},
		{"signed record with a changed subnet", signed, "c1", State{Records: []PeerRecord{changedSubnet}}, []string{RefusedBadSignature}},
		{"signed record with a bumped version", signed, "c1", State{Records: []PeerRecord{bumped}}, []string{RefusedBadSignature}},
		{"record signed by another key", signed, "c1", State{Records: []PeerRecord{signedPeer(other, "c1")}}, []string{RefusedBadSignature}},
		{"record signed for another cluster", signed, "c1", State{Records: []PeerRecord{signedPeer(priv, "c2")}}, []string{RefusedBadSignature}},
		{"message of another cluster", signed, "c2", State{Records: []PeerRecord{signedPeer(priv, "c2")}}, []string{RefusedOtherCluster}},
		{"huge unsigned tombstone", signed, "c1", State{Tombstones: []api.Tombstone{{AgentID: "b", Version: math.MaxUint64}}}, []string{RefusedUnsigned}},
		{"huge tombstone of another key", signed, "c1", State{Tombstones: []api.Tombstone{signedTombstone(other, "c1", "b", math.MaxUint64)}}, []string{RefusedBadSignature}},
		{"signed, out of range", signed, "c1", State{Records: []PeerRecord{signedPeer(priv, "c1", func(a *api.AgentInfo) { a.Overlays[0].Subnet = "128.0.0.0/1" })}}, []string{RefusedOutOfRange}},
		{"a mix", signed, "c1", State{Records: []PeerRecord{good, signedPeer(nil, "")},
			Tombstones: []api.Tombstone{{AgentID: "x", Version: 3}, signedTombstone(priv, "c1", "y", 4)}}, []string{RefusedUnsigned, RefusedUnsigned}},
		{"rotating: signed by the new key", rotating, "c1", State{Records: []PeerRecord{signedPeer(nextPriv, "c1")}}, nil},
		{"rotating: signed by the previous key", rotating, "c1", State{Records: []PeerRecord{good},
			Tombstones: []api.Tombstone{signedTombstone(priv, "c1", "b", 10)}}, nil},
		{"rotating: signed by another key", rotating, "c1", State{Records: []PeerRecord{signedPeer(other, "c1")}}, []string{RefusedBadSignature}},
		{"rotated, chain dropped: the previous key no more", rotated, "c1", State{Records: []PeerRecord{good},
			Tombstones: []api.Tombstone{signedTombstone(priv, "c1", "b", 10)}}, []string{RefusedBadSignature, RefusedBadSignature}},
		{"no key yet, TLS masters", Trust{ClusterID: "c1", Required: true, Network: &network}, "c1", State{Records: []PeerRecord{good}}, []string{RefusedBadSignature}},
		{"no cluster yet", Trust{Key: pub, Required: true, Network: &network}, "c1", State{Records: []PeerRecord{good}}, []string{RefusedOtherCluster}},
		{"--insecure, unsigned masters: unsigned taken", Trust{ClusterID: "c1", Network: &network}, "c1", State{Records: []PeerRecord{signedPeer(nil, "")},
			Tombstones: []api.Tombstone{{AgentID: "x", Version: math.MaxUint64}}}, nil},
		{"--insecure, unsigned masters: still range checked", Trust{ClusterID: "c1", Network: &network}, "c1",
			State{Records: []PeerRecord{signedPeer(nil, "", func(a *api.AgentInfo) { a.Overlays[0].Backend.VXLAN.VTEPMAC = "70:b3:d5:00:00:00" })}}, []string{RefusedOutOfRange}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, refused := tt.tr.Admit(tt.cluster, tt.st, New())
			var reasons []string
			for _, r := range refused {
				reasons = append(reasons, r.Reason)
				if r.Err == nil {
					t.Errorf("refusal %s without an error", r.Reason)
				}
			}
			if !slices.Equal(reasons, tt.want) {
				t.Errorf("refused %v, want %v (errors: %v)", reasons, tt.want, refused)
			}
			if n := len(in.Records) + len(in.Tombstones) + len(refused); n != len(tt.st.Records)+len(tt.st.Tombstones) {
				t.Errorf("%d admitted and refused of %d", n, len(tt.st.Records)+len(tt.st.Tombstones))
			}
		})
	}

	// What the membership holds exactly was checked when it came: the
	// whole-membership gossip repeats it without a signature check.
	held := New()
	held.MergeFromMasters(State{Records: []PeerRecord{good}})
	noKey := Trust{ClusterID: "c1", Required: true, Network: &network}
	if in, refused := noKey.Admit("c1", State{Records: []PeerRecord{good}}, held); len(refused) > 0 || len(in.Records) != 1 {
		t.Errorf("a held record: admitted %v, refused %v", in.Records, refused)
	}
	if _, refused := noKey.Admit("c1", State{Records: []PeerRecord{changedSubnet}}, held); len(refused) != 1 {
		t.Errorf("a held record's altered copy was not checked")
	}
}

// TestMembershipEqualVersions: two signed renderings of one record at the
// same version (a configuration change re-renders records without a new
// version). The masters' copy wins, whatever the order; between copies
// from gossip the greater encoding wins on every agent; a newer version
// from gossip replaces the masters' copy.
func TestMembershipEqualVersions(t *testing.T) {
	_, priv := testKey(t)
	x := signedPeer(priv, "c1")
	y := signedPeer(priv, "c1", func(a *api.AgentInfo) { a.MeshAddr = "198.18.0.99:6783" })
	hi, lo := x, y
	if recordLess(&x, &y) {
		hi, lo = y, x
	}
	record := func(m *Membership) PeerRecord {
		r, _ := m.Record("b")
		return r
	}

	for _, order := range [][]string{{"masters", "gossip"}, {"gossip", "masters"}} {
		m := New()
		for _, from := range order {
			if from == "masters" {
				m.MergeFromMasters(State{Records: []PeerRecord{lo}})
			} else {
				m.Merge(State{Records: []PeerRecord{hi}})
			}
		}
		if got := record(m); !got.Equal(&lo) {
			t.Errorf("merged %v: kept %+v, want the masters' copy", order, got)
		}
		if !slices.Equal(m.FromMasters(), []string{"b"}) {
			t.Errorf("merged %v: from masters %v", order, m.FromMasters())
		}
	}
	for _, order := range [][]PeerRecord{{lo, hi}, {hi, lo}} {
		m := New()
		for _, r := range order {
			m.Merge(State{Records: []PeerRecord{r}})
		}
		if got := record(m); !got.Equal(&hi) {
			t.Errorf("gossip copies: kept %+v, want the greater %+v", got, hi)
		}
	}
	m := New()
	m.MergeFromMasters(State{Records: []PeerRecord{lo}})
	newer := signedPeer(priv, "c1", func(a *api.AgentInfo) { a.Version++ })
	if news := m.Merge(State{Records: []PeerRecord{newer}}); len(news.Records) != 1 || len(m.FromMasters()) != 0 {
		t.Errorf("a newer version from gossip: news %v, from masters %v", news.Records, m.FromMasters())
	}
}

// A gossiped record carries its blocks: it still verifies, its grown and
// granted blocks are routed to it beside its subnet, the used and free
// counts (unsigned) do not travel, and a changed or added block does not
// verify.
func TestPeerRecordCarriesBlocks(t *testing.T) {
	pub, priv := testKey(t)
	used, free := uint64(3), uint64(4)
	r := signedPeer(priv, "c1", func(a *api.AgentInfo) {
		a.Overlays[0].Blocks = []api.Block{
			{Bridge: api.BridgeMesos, Prefix: "10.128.2.0/25", Origin: api.BlockLeased, Version: 2},
			{Bridge: api.BridgeDocker, Prefix: "10.128.2.128/25", Origin: api.BlockLeased, Version: 2},
			{Bridge: api.BridgeMesos, Prefix: "10.128.9.0/25", Origin: api.BlockGrown, Version: 5, Used: &used, Free: &free},
			{Bridge: api.BridgeMesos, Prefix: "10.128.7.64/26", Origin: api.BlockGranted, Donor: "d", Version: 6},
		}
	})
	wire, err := json.Marshal(Message{ClusterID: "c1", State: State{Records: []PeerRecord{r}}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(wire), `"used"`) {
		t.Errorf("gossip carries the unsigned usage: %s", wire)
	}
	msg, err := Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	got := msg.Records[0]
	if err := api.VerifyRecord(pub, got.signedInfo(), "c1"); err != nil {
		t.Fatalf("the gossiped record does not verify: %v", err)
	}
	if want := []string{"10.128.2.0/24", "10.128.7.64/26", "10.128.9.0/25"}; !slices.Equal(got.Subnets(), want) {
		t.Errorf("routed %v, want %v", got.Subnets(), want)
	}
	for name, change := range map[string]func(*PeerOverlay){
		"block prefix": func(o *PeerOverlay) { o.Blocks[0].Prefix = "10.128.2.0/26" },
		"block donor":  func(o *PeerOverlay) { o.Blocks[1].Donor = "x" },
		"block added": func(o *PeerOverlay) {
			o.Blocks = append(o.Blocks, api.Block{Bridge: api.BridgeMesos, Prefix: "10.128.8.0/25", Origin: api.BlockGrown, Version: 7})
		},
	} {
		p := got
		p.Overlays = slices.Clone(got.Overlays)
		p.Overlays[0].Blocks = slices.Clone(got.Overlays[0].Blocks)
		change(&p.Overlays[0])
		if err := api.VerifyRecord(pub, p.signedInfo(), "c1"); !errors.Is(err, api.ErrBadSignature) {
			t.Errorf("changed %s: verify = %v, want a bad signature", name, err)
		}
	}
	bad := got
	bad.Overlays = slices.Clone(got.Overlays)
	bad.Overlays[0].Blocks = []api.Block{{Bridge: "other", Prefix: "10.128.9.0/25", Origin: api.BlockGrown}}
	if err := bad.Validate(); err == nil {
		t.Error("a block of an unknown bridge validates")
	}
	network := state.DefaultConfig()
	outside := got
	outside.Overlays = slices.Clone(got.Overlays)
	outside.Overlays[0].Blocks = []api.Block{{Bridge: api.BridgeMesos, Prefix: "10.0.0.0/25", Origin: api.BlockGrown, Version: 1}}
	if err := recordInRange(&outside, &network); err == nil || !strings.Contains(err.Error(), "block 10.0.0.0/25 is outside") {
		t.Errorf("a block outside the overlay: %v", err)
	}
}
