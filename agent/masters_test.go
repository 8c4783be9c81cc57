package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestRegistrationAnsweredDeletedRetriesWithNewRequestID: the masters commit
// a registration, the operator deletes the agent, and the answer is lost.
// The retry with the same request id is answered "deleted" (the masters
// remember the id); the agent must then register with a new request id
// rather than repeat the burnt one for ever.
func TestRegistrationAnsweredDeletedRetriesWithNewRequestID(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	direct := masterClient(t, m)
	p := newMasterProxy(t, m)
	var mu sync.Mutex
	var ids []string
	p.register = func(w http.ResponseWriter, body []byte) bool {
		var req api.RegisterRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("registration body: %v", err)
			return false
		}
		mu.Lock()
		ids = append(ids, req.RequestID)
		first := len(ids) == 1
		mu.Unlock()
		if !first {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := direct.Register(ctx, req); err != nil {
			t.Errorf("first registration: %v", err)
		}
		if err := direct.DeleteAgent(ctx, req.AgentID); err != nil {
			t.Errorf("delete while the answer is in flight: %v", err)
		}
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeTimeout, "the write did not commit in time; retry with the same request_id")
		return true
	}
	gnet := fakegossip.New(fakegossip.Config{Seed: 11})
	t.Cleanup(gnet.Close)
	a := startAgent(t, hosts[0], p.URL(), filepath.Join(dir, "a0"), gnet)

	// Registered again: a record newer than the deletion (the watch may
	// show the first record in the moment before the delete).
	testutil.Eventually(t, 20*time.Second, "the agent registered again after its deletion", func() error {
		info, err := direct.Agent(context.Background(), a.ID())
		if err != nil {
			return err
		}
		mu.Lock()
		n := len(ids)
		mu.Unlock()
		if n < 3 {
			return fmt.Errorf("record version %d, but %d registrations so far", info.Version, n)
		}
		return nil
	})
	testutil.Eventually(t, 0, "the agent's overlay OK", testutil.True(func() bool {
		ov := a.Overlay().Overlay("carve")
		return ov != nil && ov.State.Status == api.StatusOK
	}))
	mu.Lock()
	defer mu.Unlock()
	if len(ids) < 3 {
		t.Fatalf("registration request ids %v: want the lost one, its retry, and a new one", ids)
	}
	if ids[1] != ids[0] {
		t.Errorf("the retry after an unknown outcome used request id %s, want the same %s", ids[1], ids[0])
	}
	if last := ids[len(ids)-1]; last == ids[0] {
		t.Errorf("the agent registered again with the burnt request id %s", last)
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// gaugeValue reads a gauge.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// gossipCount reads an agent's gossip message counter of one result.
func gossipCount(t *testing.T, a *Agent, result string) float64 {
	t.Helper()
	return counterValue(t, a.metrics.gossip.WithLabelValues(result))
}

// refusedCount reads an agent's count of gossip refused for one reason.
func refusedCount(t *testing.T, a *Agent, reason string) float64 {
	t.Helper()
	return counterValue(t, a.metrics.gossipRefused.WithLabelValues(reason))
}

// rawData is a gossip message as bytes.
type rawData []byte

func (d rawData) Encode() [][]byte                    { return [][]byte{d} }
func (d rawData) Merge(other gossip.Data) gossip.Data { return other }

// parrot is a peer that only talks: it gossips one message over and over
// and ignores what it hears.
type parrot struct{ msg rawData }

func (p parrot) Gossip() gossip.Data                           { return p.msg }
func (parrot) OnGossip([]byte) (gossip.Data, error)            { return nil, nil }
func (parrot) OnBroadcast(string, []byte) (gossip.Data, error) { return nil, nil }
func (parrot) OnUnicast(string, []byte) error                  { return nil }

func TestNetworkFrom(t *testing.T) {
	known := &api.NetworkConfig{VNI: 1024, OverlayMTU: 1420, Overlays: []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24}}}
	changed := api.NetworkConfig{VNI: 1024, OverlayMTU: 1400, Overlays: known.Overlays}
	tests := []struct {
		name        string
		cur         *api.NetworkConfig
		st          api.NetworkConfig
		want        *api.NetworkConfig
		wantChanged bool
	}{
		{"none known", nil, *known, known, true},
		{"none known, empty", nil, api.NetworkConfig{}, &api.NetworkConfig{}, true},
		{"same", known, *known, known, false},
		{"changed", known, changed, &changed, true},
		{"empty never replaces a known one", known, api.NetworkConfig{}, known, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ch := networkFrom(tt.cur, tt.st)
			if !jsonEqual(got, tt.want) || ch != tt.wantChanged {
				t.Errorf("networkFrom = %+v, %v; want %+v, %v", got, ch, tt.want, tt.wantChanged)
			}
		})
	}
}
