package dockeripam_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// These tests import package agent, so they live in the external test
// package: the agent imports dockeripam.

// The real IPAM satisfies the interface the plugin depends on.
var _ dockeripam.AddressService = (*ipam.Service)(nil)

func testLogger() *slog.Logger {
	if os.Getenv("CARVE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// waitLimit bounds the waits of these tests: a real agent and a real
// engine start slowly on a loaded machine.
const waitLimit = 60 * time.Second

// testNetwork has a dual-stack overlay "carve" and an IPv4 one, "blue".
func testNetwork() api.NetworkConfig {
	cfg := state.DefaultConfig()
	cfg.Overlays = []api.OverlayNetwork{
		{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24, Subnet6: "fd00:ca7e::/48", Prefix6: 64},
		{Name: "blue", Subnet: "10.0.0.0/16", Prefix: 24},
	}
	return cfg
}

// testService is the real IPAM (package ipam) on a store of its own, laid
// out as an agent of testNetwork would be ("carve" and "blue"), without the
// rest of the agent; addOverlay leases it another overlay.
type testService struct {
	*ipam.Service
	view ipam.View
}

func newTestService(t testing.TB) *testService {
	t.Helper()
	s := emptyService(t)
	s.addOverlay("carve", [2]string{"10.128.0.0/9", "fd00:ca7e::/48"}, [2]string{"10.128.0.0/25", "fd00:ca7e::/65"}, [2]string{"10.128.0.128/25", "fd00:ca7e:0:0:8000::/65"})
	s.addOverlay("blue", [2]string{"10.0.0.0/16"}, [2]string{"10.0.0.0/25"}, [2]string{"10.0.0.128/25"})
	return s
}

// emptyService is a testService with no overlay yet.
func emptyService(t testing.TB) *testService {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "agent.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	svc, err := ipam.New(ipam.Config{AgentID: "host-1", DB: db, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return &testService{Service: svc, view: ipam.View{Self: &api.AgentInfo{AgentID: "host-1", Version: 1}}}
}

// addOverlay leases the agent an overlay of the universes (IPv4, IPv6; ""
// for none) whose subnet its bridges' ranges halve (mesos, docker; "" for
// no such bridge), and syncs the IPAM.
func (s *testService) addOverlay(name string, universe, mesos, docker [2]string) {
	ov := api.AgentOverlay{Info: api.OverlayNetwork{Name: name, Subnet: universe[0], Subnet6: universe[1]},
		State: api.OverlayState{Status: api.StatusOK}}
	for fam, sub := range []*string{&ov.Subnet, &ov.Subnet6} {
		if half := cmp.Or(mesos[fam], docker[fam]); half != "" {
			p := netip.MustParsePrefix(half)
			*sub = netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked().String()
		}
	}
	for _, br := range []struct {
		ranges [2]string
		dst    **api.BridgeInfo
		prefix string
	}{{mesos, &ov.MesosBridge, "m-"}, {docker, &ov.DockerBridge, "d-"}} {
		if br.ranges != [2]string{} {
			*br.dst = &api.BridgeInfo{Name: br.prefix + name, IP: br.ranges[0], IP6: br.ranges[1]}
		}
	}
	self := *s.view.Self
	self.Overlays = append(slices.Clone(self.Overlays), ov)
	peer := ipam.Peer{ID: self.AgentID, Version: self.Version}
	for _, o := range self.Overlays {
		for _, sub := range []string{o.Subnet, o.Subnet6} {
			if sub != "" {
				peer.Subnets = append(peer.Subnets, sub)
			}
		}
	}
	s.view = ipam.View{Self: &self, Peers: []ipam.Peer{peer}}
	s.Sync(s.view)
}

func startMaster(t *testing.T, dir string, cfg api.NetworkConfig) *master.Master {
	t.Helper()
	return mastertest.Start(t, dir, cfg, testLogger())
}

// realAgent runs a real master and a real agent whose dataplane works in
// host's namespace (it creates d-carve there with its gateway), and returns
// the agent's IPAM once both overlays are served.
func realAgent(t *testing.T, host *netnslab.Host) *agent.Agent {
	t.Helper()
	dir := t.TempDir()
	m := startMaster(t, filepath.Join(dir, "m1"), testNetwork())
	gnet := fakegossip.New(fakegossip.Config{Seed: 1})
	t.Cleanup(gnet.Close)
	a, err := agent.New(agent.Config{
		DataDir: filepath.Join(dir, "agent"), Masters: []string{"http://" + m.HTTPAddr()}, ID: "host-1", IP: host.IP.Addr(),
		HTTPAddr: "127.0.0.1:0", MesosBridge: true, DockerBridge: true, ResyncInterval: 5 * time.Second,
		WatchWait: 2 * time.Second, NetNS: host.NsHandle(), Logger: testLogger(),
		Insecure: true, // a plain http master on loopback and fake gossip
		NewRouter: func(id string) (agent.Router, error) {
			r, err := gnet.Join(id)
			if err != nil {
				return nil, err
			}
			return r, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	testutil.Eventually(t, waitLimit, "the agent serves both overlays with docker bridges", testutil.True(func() bool {
		for _, ov := range []string{"carve", "blue"} {
			if _, _, ok := a.IPAM().BridgeSubnets(ov, api.BridgeDocker); !ok {
				return false
			}
			o := a.Overlay().Overlay(ov)
			if o == nil || o.State.Status != api.StatusOK {
				return false
			}
		}
		return true
	}))
	return a
}

// backend is an AddressService under test.
type backend struct {
	name string
	svc  dockeripam.AddressService
}

// backends returns the IPAM on its own, and the IPAM of a real agent when the
// test can create namespaces (root).
func backends(t *testing.T) []backend {
	t.Helper()
	out := []backend{{"service", newTestService(t)}}
	if !netnslab.IsRoot() {
		t.Log("the real agent's IPAM needs root (its agent programs a namespace): testing the IPAM on its own only")
		return out
	}
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	a := realAgent(t, lab.Hosts()[0])
	return append(out, backend{"agent", a.IPAM()})
}

// pluginCall posts a plugin call to h and returns the status, the content
// type and the body.
func pluginCall(t *testing.T, h http.Handler, path string, body any) (int, string, string) {
	t.Helper()
	var rd io.Reader = http.NoBody
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req := httptest.NewRequest(http.MethodPost, path, rd)
	req.Header.Set("Accept", dockeripam.ContentType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get("Content-Type"), strings.TrimSpace(rec.Body.String())
}
