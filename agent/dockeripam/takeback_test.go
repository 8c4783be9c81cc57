package dockeripam_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/testutil"
)

// socketPlugin calls the plugin over its unix socket, as Docker does: real
// HTTP, not the handler in process.
func socketPlugin(t *testing.T, sock string) *plugin {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	proxy := &httputil.ReverseProxy{Transport: tr, Rewrite: func(r *httputil.ProxyRequest) {
		r.Out.URL.Scheme, r.Out.URL.Host = "http", "plugin"
	}}
	return &plugin{t: t, h: proxy}
}

// carveNetwork is the Docker network carve makes for overlay "carve" of
// newTestService, as the engine lists it.
func carveNetwork() map[string]any {
	return map[string]any{"Name": "carve", "Id": "id-carve", "Driver": "bridge",
		"IPAM":    map[string]any{"Driver": "carve", "Options": map[string]string{"network": "carve"}, "Config": []map[string]string{{"Subnet": "10.128.0.128/25"}}},
		"Options": map[string]string{"com.docker.network.bridge.name": "d-carve"}, "Labels": map[string]string{dockeripam.LabelOverlay: "carve"}}
}

// allocOf is the allocation that holds addr on overlay.
func allocOf(svc dockeripam.AddressService, overlay, addr string) (api.Allocation, bool) {
	for _, a := range svc.List(overlay).Allocations {
		for _, ip := range a.IPs {
			if ip.Address == addr {
				return a, true
			}
		}
	}
	return api.Allocation{}, false
}

// TestTakeBackWaitsForTheAgent: an agent restarts with a lost data dir
// while a Docker container runs with 10.128.0.130. The engine answers
// before the agent has restored its overlays, so the first take-back
// cannot claim the address (not_ready); requests for addresses must wait
// for a take-back that can, never get .130 meanwhile (before the fix the
// first take-back opened the gate and the next request got .130).
func TestTakeBackWaitsForTheAgent(t *testing.T) {
	e := startFakeEngine(t)
	e.setNetwork(carveNetwork())
	e.attach("carve", "running", "10.128.0.130/25")
	f := emptyService(t) // restarting: no overlay restored yet
	sock := shortTempDir(t) + "/carve.sock"
	// The retry is the test's to trigger (CollectNow), so that what a
	// request sees between the take-backs is deterministic.
	s := runService(t, f, dockeripam.Options{PluginSocket: sock, DockerHost: e.host(), GCInterval: time.Hour,
		TakeBackRetry: time.Hour, TakeBackWait: 50 * time.Millisecond})
	testutil.Eventually(t, waitLimit, "the engine connected", testutil.True(func() bool { return s.Status().Engine.Connected }))
	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The agent restores its overlay now (its lease arrived).
	f.addOverlay("carve", [2]string{"10.128.0.0/9", "fd00:ca7e::/48"}, [2]string{"10.128.0.0/25", "fd00:ca7e::/65"}, [2]string{"10.128.0.128/25", "fd00:ca7e:0:0:8000::/65"})
	pl := socketPlugin(t, sock)
	pool := pl.networkPool("carve", "10.128.0.128/25")
	req := map[string]any{"PoolID": pool.PoolID, "Options": map[string]string{"com.docker.network.endpoint.macaddress": "02:42:0a:80:00:99"}}
	msg := pl.fail("/IpamDriver.RequestAddress", req)
	wantContains(t, "a request before the take-back", msg, "taking back", "retry")

	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, ok := allocOf(f, "carve", "10.128.0.130/25")
	if !ok || !strings.HasPrefix(a.ContainerID, "docker-ep-") {
		t.Fatalf("the running container's address was not taken back: %+v", f.List("carve").Allocations)
	}
	if a.Owner == nil || a.Owner.ContainerName != "running" || a.Owner.ContainerID != "running" {
		t.Errorf("the taken-back allocation's owner %+v does not name the container", a.Owner)
	}
	if got := pl.address(pool.PoolID, "", req["Options"].(map[string]string)); got == "10.128.0.130/25" {
		t.Fatalf("handed out the address a running container holds: %s", got)
	}
}

// TestTakeBackRetriesSoon: the take-back that found the agent not ready is
// tried again within TakeBackRetry, not at the next collection (an hour
// here), and a request waits for it.
func TestTakeBackRetriesSoon(t *testing.T) {
	e := startFakeEngine(t)
	e.setNetwork(carveNetwork())
	e.attach("carve", "running", "10.128.0.130/25")
	f := emptyService(t)
	sock := shortTempDir(t) + "/carve.sock"
	s := runService(t, f, dockeripam.Options{PluginSocket: sock, DockerHost: e.host(), GCInterval: time.Hour,
		TakeBackRetry: 20 * time.Millisecond, TakeBackWait: waitLimit})
	testutil.Eventually(t, waitLimit, "the engine connected", testutil.True(func() bool { return s.Status().Engine.Connected }))
	f.addOverlay("carve", [2]string{"10.128.0.0/9", "fd00:ca7e::/48"}, [2]string{"10.128.0.0/25", "fd00:ca7e::/65"}, [2]string{"10.128.0.128/25", "fd00:ca7e:0:0:8000::/65"})
	pl := socketPlugin(t, sock)
	pool := pl.networkPool("carve", "10.128.0.128/25")
	if got := pl.address(pool.PoolID, "", nil); got == "10.128.0.130/25" {
		t.Fatalf("handed out the address a running container holds: %s", got)
	}
	if _, ok := allocOf(f, "carve", "10.128.0.130/25"); !ok {
		t.Fatalf("the running container's address was not taken back: %+v", f.List("carve").Allocations)
	}
}

// TestDockerOwners: the container that holds an address Docker asked for
// (the request names none) is learnt from the engine and recorded: the
// allocation's owner names it, and a request for its address says who
// has it.
func TestDockerOwners(t *testing.T) {
	e := startFakeEngine(t)
	f := newTestService(t)
	sock := shortTempDir(t) + "/carve.sock"
	s := runService(t, f, dockeripam.Options{PluginSocket: sock, DockerHost: e.host(), GCInterval: time.Hour})
	testutil.Eventually(t, waitLimit, "networks", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))
	pl := socketPlugin(t, sock)
	pool := pl.networkPool("carve", "10.128.0.128/25")
	got := pl.address(pool.PoolID, "", map[string]string{"com.docker.network.endpoint.macaddress": "02:42:0a:80:00:82"})
	id := "4f1c9e0d2b7a63c8e5f4a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6"
	e.attachAs("carve", id, "web", "ep-1234", got)
	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, ok := allocOf(f, "carve", got)
	if !ok {
		t.Fatalf("no allocation holds %s", got)
	}
	want := api.Owner{Runtime: api.RuntimeDocker, ContainerID: id, ContainerName: "web", EndpointID: "ep-1234", MAC: "02:42:0a:80:00:82"}
	if a.Owner == nil || *a.Owner != want {
		t.Fatalf("owner %+v, want %+v", a.Owner, want)
	}
	msg := pl.fail("/IpamDriver.RequestAddress", map[string]any{"PoolID": pool.PoolID, "Address": got})
	wantContains(t, "a request for a taken address", msg, "docker container web", id[:12])
}

// TestPoolWithoutSubnetRefused: docker network create --ipam-opt
// network=carve without --subnet, for an overlay carve's Docker network
// serves, is refused naming that network (answering the range made dockerd
// find it in use, give it back and ask again forever); a wrong subnet's
// refusal names it too, and never recommends leaving the subnet out.
func TestPoolWithoutSubnetRefused(t *testing.T) {
	e := startFakeEngine(t)
	f := newTestService(t)
	sock := shortTempDir(t) + "/carve.sock"
	s := runService(t, f, dockeripam.Options{PluginSocket: sock, DockerHost: e.host(), GCInterval: time.Hour})
	testutil.Eventually(t, waitLimit, "networks", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))
	pl := socketPlugin(t, sock)
	for _, tt := range []struct {
		name string
		pool string
	}{{"no subnet", ""}, {"another subnet", "10.128.7.0/24"}} {
		t.Run(tt.name, func(t *testing.T) {
			msg := (&plugin{t: t, h: pl.h}).fail("/IpamDriver.RequestPool", map[string]any{"AddressSpace": "CarveLocal", "Pool": tt.pool, "Options": map[string]string{"network": "carve"}})
			wantContains(t, "pool refusal", msg, "docker run --net carve")
			if strings.Contains(msg, "leave it out") {
				t.Errorf("the refusal %q recommends leaving the subnet out", msg)
			}
		})
	}
	// The network carve made still gets its pool (Docker names its subnet).
	if p := pl.networkPool("carve", "10.128.0.128/25"); p.Pool != "10.128.0.128/25" {
		t.Errorf("carve's own network's pool: %+v", p)
	}
}
