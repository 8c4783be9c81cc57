package ipam

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/unixsock"
)

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testSelf is an agent record with a dual-stack overlay whose /23 gives a
// /24 to each bridge.
func testSelf() *api.AgentInfo {
	return &api.AgentInfo{AgentID: "self", IP: "198.18.0.10", Version: 9, Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/16", Prefix: 23, Subnet6: "fd00::/48", Prefix6: 64},
		Subnet:       "10.128.2.0/23",
		Subnet6:      "fd00:0:0:1::/64",
		MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: "10.128.2.0/24", IP6: "fd00:0:0:1::/65"},
		DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: "10.128.3.0/24"},
		State:        api.OverlayState{Status: api.StatusOK},
	}}}
}

// peerOf is an agent's leased subnets (of its one overlay), as the agent's
// membership has them.
func peerOf(a *api.AgentInfo) Peer {
	return Peer{ID: a.AgentID, Version: a.Version, Subnets: []string{a.Overlays[0].Subnet, a.Overlays[0].Subnet6}}
}

// testView is self and another agent holding the next /23.
func testView(self *api.AgentInfo) View {
	return View{Self: self, Network: &api.NetworkConfig{OverlayMTU: 1400}, Peers: []Peer{
		peerOf(self), {ID: "other", Version: 4, Subnets: []string{"10.128.4.0/23", "fd00:0:0:2::/64"}},
	}}
}

// openDB opens (or creates) the store in dir, closed at the end of the test.
func openDB(t *testing.T, dir string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// harness is a Service on a real store, serving its real unix socket.
type harness struct {
	t      *testing.T
	dir    string
	db     *bolt.DB
	reg    *prometheus.Registry
	svc    *Service
	client *api.IPAMClient
	cancel context.CancelFunc
	done   chan struct{}
}

type harnessOptions struct {
	cniCache string
	view     *View // nil: testView(testSelf()); the zero View: no Sync
	reclaim  ReclaimConfig
	growth   GrowthConfig
}

// newHarness starts a Service on the store in dir, synced with the view.
func newHarness(t *testing.T, dir string, opts harnessOptions) *harness {
	t.Helper()
	db := openDB(t, dir)
	reg := prometheus.NewRegistry()
	svc, err := New(Config{AgentID: "self", DB: db, CNICacheDir: opts.cniCache, Registerer: reg, Logger: testLogger(), Reclaim: opts.reclaim, Growth: opts.growth})
	if err != nil {
		t.Fatal(err)
	}
	v := testView(testSelf())
	if opts.view != nil {
		v = *opts.view
	}
	if v.Self != nil {
		svc.Sync(v)
	}
	sock := filepath.Join(dir, "agent.sock")
	ln, err := unixsock.Listen(sock, os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, dir: dir, db: db, reg: reg, svc: svc, client: api.NewIPAMClient(sock, 10*time.Second), cancel: cancel, done: make(chan struct{})}
	go func() {
		svc.Serve(ctx, ln)
		close(h.done)
	}()
	t.Cleanup(h.close)
	return h
}

// close stops serving and closes the store (once).
func (h *harness) close() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
	h.svc.Close() // the growths in flight end before the store closes
	h.db.Close()
	h.cancel = nil
}

func (h *harness) alloc(cid, ifname, bridge string) *api.Allocation {
	h.t.Helper()
	a, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: ifname, Bridge: bridge})
	if err != nil {
		h.t.Fatalf("allocate %s/%s: %v", cid, ifname, err)
	}
	return a
}

func addrs(a *api.Allocation) string {
	var out []string
	for _, ip := range a.IPs {
		out = append(out, ip.Address+" gw "+ip.Gateway)
	}
	return strings.Join(out, ", ")
}

func req(cid string) api.IPAMRequest {
	return api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0"}
}

// counter reads a counter of the harness's registry (0 when absent).
func (h *harness) counter(name, label, value string) float64 {
	h.t.Helper()
	v, _ := h.gauge(name, map[string]string{label: value})
	return v
}

// gauge reads a counter or gauge of the harness's registry whose labels
// include labels; false when there is none.
func (h *harness) gauge(name string, labels map[string]string) (float64, bool) {
	h.t.Helper()
	return gaugeIn(h.t, h.reg, name, labels)
}

// gaugeIn reads a counter or gauge of reg whose labels include labels;
// false when there is none.
func gaugeIn(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			matches := true
			for k, v := range labels {
				matches = matches && have[k] == v
			}
			if !matches {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}
