package dockeripam_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/testutil"
)

// fakeEngine is a Docker engine's API, the part carve uses, on a unix socket.
type fakeEngine struct {
	t    *testing.T
	sock string

	mu       sync.Mutex
	networks map[string]map[string]any // by name: the network resource
	creates  []map[string]any          // POST /networks/create bodies
	removes  []string                  // networks removed
	failList bool
	events   chan map[string]any
	streams  int // event streams opened
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	// Unix socket paths are limited to 108 bytes: t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "carve-dk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startFakeEngine(t *testing.T) *fakeEngine {
	t.Helper()
	e := &fakeEngine{t: t, sock: filepath.Join(shortTempDir(t), "docker.sock"), networks: map[string]map[string]any{}, events: make(chan map[string]any, 16)}
	ln, err := net.Listen("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return e
}

func (e *fakeEngine) host() string { return "unix://" + e.sock }

func (e *fakeEngine) reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_ping" {
		w.Header().Set("API-Version", "1.41")
		io.WriteString(w, "OK")
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/v1.41")
	if !ok {
		e.reply(w, http.StatusBadRequest, map[string]string{"message": "unversioned call " + r.URL.Path})
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case path == "/version":
		e.reply(w, 200, map[string]string{"Version": "fake-1", "ApiVersion": "1.41"})
	case path == "/networks" && r.Method == http.MethodGet:
		if e.failList {
			e.reply(w, 500, map[string]string{"message": "injected failure"})
			return
		}
		var out []map[string]any
		for _, n := range e.networks {
			m := map[string]any{}
			for k, v := range n {
				if k != "Containers" {
					m[k] = v
				}
			}
			out = append(out, m)
		}
		e.reply(w, 200, out)
	case path == "/networks/create" && r.Method == http.MethodPost:
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			e.reply(w, 400, map[string]string{"message": err.Error()})
			return
		}
		e.creates = append(e.creates, body)
		name, _ := body["Name"].(string)
		if _, ok := e.networks[name]; ok {
			e.reply(w, 409, map[string]string{"message": "network with name " + name + " already exists"})
			return
		}
		n := map[string]any{"Id": "id-" + name}
		for k, v := range body {
			if k != "CheckDuplicate" {
				n[k] = v
			}
		}
		e.networks[name] = n
		e.reply(w, 201, map[string]string{"Id": n["Id"].(string)})
	case strings.HasPrefix(path, "/networks/") && r.Method == http.MethodGet:
		key := strings.TrimPrefix(path, "/networks/")
		for name, n := range e.networks {
			if name == key || n["Id"] == key {
				e.reply(w, 200, n)
				return
			}
		}
		e.reply(w, 404, map[string]string{"message": "network " + key + " not found"})
	case strings.HasPrefix(path, "/networks/") && r.Method == http.MethodDelete:
		key := strings.TrimPrefix(path, "/networks/")
		for name, n := range e.networks {
			if name == key || n["Id"] == key {
				if cs, _ := n["Containers"].(map[string]any); len(cs) > 0 {
					e.reply(w, 403, map[string]string{"message": "error while removing network: network " + name + " has active endpoints"})
					return
				}
				delete(e.networks, name)
				e.removes = append(e.removes, name)
				w.WriteHeader(204)
				return
			}
		}
		e.reply(w, 404, map[string]string{"message": "network " + key + " not found"})
	case path == "/events":
		e.streams++
		e.mu.Unlock()
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				e.mu.Lock()
				return
			case ev := <-e.events:
				json.NewEncoder(w).Encode(ev)
				w.(http.Flusher).Flush()
			}
		}
	default:
		e.reply(w, 404, map[string]string{"message": "no such call " + r.Method + " " + path})
	}
}

// setNetwork puts a network resource into the engine.
func (e *fakeEngine) setNetwork(n map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.networks[n["Name"].(string)] = n
}

// attach lists an endpoint with addr on a network.
func (e *fakeEngine) attach(network, container, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.networks[network]
	cs, _ := n["Containers"].(map[string]any)
	if cs == nil {
		cs = map[string]any{}
		n["Containers"] = cs
	}
	cs[container] = map[string]any{"Name": container, "IPv4Address": addr}
}

// attachAs lists a container's endpoint, with its id, name and endpoint
// id, as the engine does.
func (e *fakeEngine) attachAs(network, id, name, endpoint, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.networks[network]
	cs, _ := n["Containers"].(map[string]any)
	if cs == nil {
		cs = map[string]any{}
		n["Containers"] = cs
	}
	cs[id] = map[string]any{"Name": name, "EndpointID": endpoint, "IPv4Address": addr}
}

// detach removes a container's endpoint from a network.
func (e *fakeEngine) detach(network, container string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if cs, _ := e.networks[network]["Containers"].(map[string]any); cs != nil {
		delete(cs, container)
	}
}

// removed lists the networks removed through the API.
func (e *fakeEngine) removed() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.removes)
}

// names lists the engine's networks.
func (e *fakeEngine) names() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for n := range e.networks {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (e *fakeEngine) setFailList(v bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failList = v
}

func (e *fakeEngine) createBodies() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]map[string]any(nil), e.creates...)
}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// runService runs a Service until the test ends.
func runService(t *testing.T, svc dockeripam.AddressService, opts dockeripam.Options) *dockeripam.Service {
	t.Helper()
	if opts.PluginSocket == "" {
		opts.PluginSocket = filepath.Join(shortTempDir(t), "carve.sock")
	}
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	s, err := dockeripam.New(svc, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if _, err := os.Lstat(opts.PluginSocket); err == nil {
			t.Errorf("plugin socket %s left behind", opts.PluginSocket)
		}
	})
	return s
}

func networkState(s *dockeripam.Service, overlay string) dockeripam.NetworkStatus {
	for _, n := range s.Status().Networks {
		if n.Overlay == overlay {
			return n
		}
	}
	return dockeripam.NetworkStatus{}
}

func TestNoEngine(t *testing.T) {
	dir := shortTempDir(t)
	host := "unix://" + filepath.Join(dir, "nobody.sock")
	sock := filepath.Join(dir, "plugins", "carve.sock")
	s := runService(t, newTestService(t), dockeripam.Options{PluginSocket: sock, DockerHost: host})
	testutil.Eventually(t, waitLimit, "engine status", testutil.True(func() bool { return s.Status().Engine.Error != "not tried yet" }))
	st := s.Status()
	if st.Engine.Connected || !st.Engine.Absent || !strings.Contains(st.Engine.Error, "no Docker engine at "+host) {
		t.Errorf("engine status %+v, want the missing engine named", st.Engine)
	}
	if !st.Plugin.Serving || st.Plugin.Driver != "carve" || st.Plugin.Socket != sock {
		t.Errorf("plugin status %+v", st.Plugin)
	}
	if err := s.CollectNow(context.Background()); err == nil || !strings.Contains(err.Error(), "no Docker engine") {
		t.Errorf("collection without an engine: %v", err)
	}
	// The plugin answers on its socket (its directory was created) meanwhile.
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Post("http://plugin/Plugin.Activate", dockeripam.ContentType, strings.NewReader("null"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(body)) != `{"Implements":["IpamDriver"]}` {
		t.Errorf("activate over the socket: %s", body)
	}

	// A second service refuses the live socket.
	other, err := dockeripam.New(newTestService(t), dockeripam.Options{PluginSocket: sock, DockerHost: host, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "served by another process") {
		t.Errorf("second service on a live socket: %v", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "carve.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the file stays, nobody serves it: a crashed agent's
	s := runService(t, newTestService(t), dockeripam.Options{PluginSocket: sock, DockerHost: "unix://" + filepath.Join(filepath.Dir(sock), "none.sock")})
	testutil.Eventually(t, waitLimit, "plugin serving", testutil.True(func() bool { return s.Status().Plugin.Serving }))
}

func TestEngineCreatesNetworks(t *testing.T) {
	e := startFakeEngine(t)
	f := newTestService(t)
	s := runService(t, f, dockeripam.Options{DockerHost: e.host(), MTU: func(string) int { return 1400 }, GCInterval: time.Hour})
	testutil.Eventually(t, waitLimit, "both networks ok", testutil.True(func() bool {
		return networkState(s, "carve").State == dockeripam.NetworkOK && networkState(s, "blue").State == dockeripam.NetworkOK
	}))
	if st := s.Status().Engine; !st.Connected || st.APIVersion != "1.41" || st.Version != "fake-1" {
		t.Errorf("engine status %+v", st)
	}
	bodies := map[string]string{}
	for _, b := range e.createBodies() {
		data, _ := json.Marshal(b)
		bodies[b["Name"].(string)] = string(data)
	}
	want := map[string]string{
		"carve": `{"CheckDuplicate":true,"Driver":"bridge","EnableIPv6":true,` +
			`"IPAM":{"Config":[{"Gateway":"10.128.0.129","Subnet":"10.128.0.128/25"},{"Gateway":"fd00:ca7e::8000:0:0:1","Subnet":"fd00:ca7e:0:0:8000::/65"}],"Driver":"carve","Options":{"network":"carve"}},` +
			`"Labels":{"net.carve.overlay":"carve"},"Name":"carve",` +
			`"Options":{"com.docker.network.bridge.enable_ip_masquerade":"false","com.docker.network.bridge.name":"d-carve","com.docker.network.driver.mtu":"1400"}}`,
		"blue": `{"CheckDuplicate":true,"Driver":"bridge","EnableIPv6":false,` +
			`"IPAM":{"Config":[{"Gateway":"10.0.0.129","Subnet":"10.0.0.128/25"}],"Driver":"carve","Options":{"network":"blue"}},` +
			`"Labels":{"net.carve.overlay":"blue"},"Name":"blue",` +
			`"Options":{"com.docker.network.bridge.enable_ip_masquerade":"false","com.docker.network.bridge.name":"d-blue","com.docker.network.driver.mtu":"1400"}}`,
	}
	for name, w := range want {
		// Normalise the expectation through the same map encoding.
		var m map[string]any
		if err := json.Unmarshal([]byte(w), &m); err != nil {
			t.Fatal(err)
		}
		wn, _ := json.Marshal(m)
		if bodies[name] != string(wn) {
			t.Errorf("create %s:\n got %s\nwant %s", name, bodies[name], wn)
		}
	}
	if len(e.createBodies()) != 2 {
		t.Errorf("%d creates, want 2", len(e.createBodies()))
	}

	// A new overlay gets its network when the agent says so.
	f.addOverlay("green", [2]string{"10.2.0.0/16"}, [2]string{}, [2]string{"10.2.0.128/25"})
	s.Sync()
	testutil.Eventually(t, waitLimit, "green's network", testutil.True(func() bool { return networkState(s, "green").State == dockeripam.NetworkOK }))
	if n := len(e.createBodies()); n != 3 {
		t.Errorf("%d creates after green, want 3 (nothing re-created)", n)
	}
}

func TestEngineMismatchLeftAlone(t *testing.T) {
	e := startFakeEngine(t)
	e.setNetwork(map[string]any{"Name": "carve", "Id": "theirs", "Driver": "bridge",
		"IPAM":    map[string]any{"Driver": "default", "Config": []any{map[string]any{"Subnet": "172.18.0.0/16", "Gateway": "172.18.0.1"}}},
		"Options": map[string]any{}})
	s := runService(t, newTestService(t), dockeripam.Options{DockerHost: e.host(), GCInterval: time.Hour})
	testutil.Eventually(t, waitLimit, "statuses", testutil.True(func() bool {
		return networkState(s, "carve").State != "" && networkState(s, "blue").State == dockeripam.NetworkOK
	}))
	st := networkState(s, "carve")
	if st.State != dockeripam.NetworkMismatch || st.ID != "theirs" {
		t.Fatalf("status %+v, want a mismatch", st)
	}
	wantContains(t, "mismatch", st.Error, "carve exists with other settings", "IPAM driver is default (want carve)",
		"172.18.0.0/16 gateway 172.18.0.1", "10.128.0.128/25 gateway 10.128.0.129", "leaves it alone")
	for _, b := range e.createBodies() {
		if b["Name"] == "carve" {
			t.Errorf("carve was created over the existing one")
		}
	}
}

func TestLeakCollection(t *testing.T) {
	e := startFakeEngine(t)
	f := newTestService(t)
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	const grace = time.Minute
	s := runService(t, f, dockeripam.Options{DockerHost: e.host(), GCInterval: time.Hour, GCGrace: grace, Now: clk.Now})
	testutil.Eventually(t, waitLimit, "networks", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))

	alloc := func(cid, bridge string) string {
		t.Helper()
		a, err := f.Allocate(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Bridge: bridge, Family: "4"})
		if err != nil {
			t.Fatal(err)
		}
		return a.IPs[0].Address
	}
	collect := func() {
		t.Helper()
		if err := s.CollectNow(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	have := func(cid string) bool {
		for _, a := range f.List("carve").Allocations {
			if a.ContainerID == cid {
				return true
			}
		}
		return false
	}
	used := alloc("docker-used", api.BridgeDocker)
	alloc("docker-leak", api.BridgeDocker)
	alloc("cni-1", api.BridgeMesos)
	e.attach("carve", "c1", used)

	collect() // starts the clock of the leak
	clk.advance(grace - time.Second)
	collect()
	if !have("docker-leak") {
		t.Fatal("released before its grace period")
	}
	clk.advance(time.Second)
	collect()
	if have("docker-leak") {
		t.Error("the leak outlived its grace period")
	}
	if !have("docker-used") || !have("cni-1") {
		t.Error("released an address in use, or another bridge's")
	}
	if st := s.Status().GC; st.Released != 1 || st.Error != "" || !st.LastRun.Equal(clk.Now()) {
		t.Errorf("gc status %+v", st)
	}

	// No release while the engine cannot be listed.
	alloc("docker-leak2", api.BridgeDocker)
	collect()
	clk.advance(2 * grace)
	e.setFailList(true)
	if err := s.CollectNow(context.Background()); err == nil {
		t.Error("collection with an unlistable engine succeeded")
	}
	if !have("docker-leak2") || !strings.Contains(s.Status().GC.Error, "injected failure") {
		t.Errorf("released without a listing, or no error in status: %+v", s.Status().GC)
	}
	e.setFailList(false)
	collect()
	if have("docker-leak2") {
		t.Error("leak2 not released once the engine answered")
	}

	// A (replayed) request for an attachment restarts its grace period.
	pl := &plugin{t: t, h: s.Handler()}
	pool := pl.networkPool("carve", "10.128.0.128/25")
	mac := map[string]string{"com.docker.network.endpoint.macaddress": "02:42:00:00:00:01"}
	pl.address(pool.PoolID, "", mac)
	collect()
	clk.advance(grace)
	pl.address(pool.PoolID, "", mac)
	collect()
	if !have("docker-024200000001") {
		t.Error("released right after a request for it")
	}
	clk.advance(grace)
	collect()
	if have("docker-024200000001") {
		t.Error("not released a grace period after its last request")
	}

	// Docker events trigger a collection.
	clk.advance(time.Hour)
	e.events <- map[string]any{"Type": "container", "Action": "destroy", "Actor": map[string]any{"ID": "c1"}}
	testutil.Eventually(t, waitLimit, "a collection after the event", testutil.True(func() bool { return s.Status().GC.LastRun.Equal(clk.Now()) }))
}

// TestReclaimRunningContainers: addresses that running containers hold but
// the agent does not know (it lost its data dir) are taken back from the
// engine's endpoints before new addresses are handed out.
func TestReclaimRunningContainers(t *testing.T) {
	e := startFakeEngine(t)
	f := newTestService(t)
	s := runService(t, f, dockeripam.Options{DockerHost: e.host(), GCInterval: time.Hour})
	testutil.Eventually(t, waitLimit, "networks", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))

	// Lowest free addresses of the docker range would be .130 and .131: a
	// running container holds .130 without any allocation.
	e.attach("carve", "running", "10.128.0.130/25")
	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	var holder string
	for _, a := range f.List("carve").Allocations {
		if a.IPs[0].Address == "10.128.0.130/25" {
			holder = a.ContainerID
		}
	}
	if !strings.HasPrefix(holder, "docker-ep-") {
		t.Fatalf("the running container's address was not taken back: %+v", f.List("carve").Allocations)
	}
	pl := &plugin{t: t, h: s.Handler()}
	pool := pl.networkPool("carve", "10.128.0.128/25")
	if got := pl.address(pool.PoolID, "", nil); got == "10.128.0.130/25" {
		t.Fatalf("handed out the address a running container holds: %s", got)
	}
	// A second collection claims nothing twice.
	before := len(f.List("carve").Allocations)
	if err := s.CollectNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := len(f.List("carve").Allocations); after != before {
		t.Errorf("allocations went from %d to %d on a second collection", before, after)
	}
}
