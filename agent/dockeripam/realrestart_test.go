package dockeripam_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/dockerlab"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// dockerAgent is a real agent that runs the Docker plugin itself (as
// carve agent does), on the plugin socket sock, following the engine at
// dockerHost, with its data dir dataDir; stop ends it.
type dockerAgent struct {
	*agent.Agent
	stop func()
}

func startDockerAgent(t *testing.T, host *netnslab.Host, masterAddr, dataDir, sock, dockerHost string) *dockerAgent {
	t.Helper()
	// A gossip network of its own per incarnation: the agent is alone.
	gnet := fakegossip.New(fakegossip.Config{Seed: 1})
	t.Cleanup(gnet.Close)
	a, err := agent.New(agent.Config{
		DataDir: dataDir, Masters: []string{"http://" + masterAddr}, ID: "host-1", IP: host.IP.Addr(),
		HTTPAddr: "127.0.0.1:0", MesosBridge: true, DockerBridge: true, ResyncInterval: 5 * time.Second,
		WatchWait: 2 * time.Second, NetNS: host.NsHandle(), Logger: testLogger(),
		DockerPluginSocket: sock, DockerHost: dockerHost,
		Insecure: true,
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
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	t.Cleanup(stop)
	return &dockerAgent{Agent: a, stop: stop}
}

// gate is a TCP proxy on loopback to a master that refuses connections
// until opened: an agent behind it restores its overlays only then.
type gate struct {
	ln   net.Listener
	open atomic.Bool
}

func startGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		// The agent's idle keep-alive connections outlive it: close them.
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !g.open.Load() {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(up, c); up.Close() }()
			go func() { defer wg.Done(); io.Copy(c, up); c.Close() }()
		}
	}()
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

// containerName is the container's name as the engine has it (without
// the leading slash of its inspect).
func containerName(t *testing.T, d *engine, id string) string {
	t.Helper()
	var c struct{ Name string }
	d.call(t, http.MethodGet, "/containers/"+id+"/json", nil, &c)
	return strings.TrimPrefix(c.Name, "/")
}

// TestRealDockerAgentRestartLostDataDir: a container runs on carve's Docker
// network; the agent stops, loses its data dir and starts again. The
// plugin's engine loop answers long before the agent has its lease again:
// the next docker run must not get the running container's address (it
// did before the fix: the take-back failed not_ready, opened the gate and
// waited for the next collection), the running container's address is
// taken back naming it, and the new container is recorded as its
// address's owner, by name and id, which a docker run --ip of a taken
// address names.
func TestRealDockerAgentRestartLostDataDir(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root: network namespaces and a Docker engine")
	bins, err := dockerlab.Binaries()
	testutil.Require(t, err == nil, "%v", err)
	busybox, err := enginelab.StaticBusybox()
	testutil.Require(t, err == nil, "%v", err)
	rootBefore := rootState(t)
	t.Cleanup(func() {
		if after := rootState(t); after != rootBefore {
			t.Errorf("the root namespace changed:\n--- before\n%s\n--- after\n%s", rootBefore, after)
		}
	})
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	host := lab.Hosts()[0]
	dir := t.TempDir()
	m := startMaster(t, filepath.Join(dir, "m1"), testNetwork())

	driverName := fmt.Sprintf("carve-test-%d", os.Getpid())
	pluginDir := filepath.Join(shortTempDir(t), "plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(pluginDir, driverName+".sock")
	engineDir := filepath.Join(shortTempDir(t), "engine")
	d := startEngine(t, host, engineDir, pluginDir, bins)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := d.ImportBusybox(ctx, busybox); err != nil {
		t.Fatal(err)
	}
	probe, err := d.run(t, "none")
	testutil.Require(t, err == nil, "dockerd cannot run containers here: %v", err)
	d.remove(t, probe)

	a1 := startDockerAgent(t, host, m.HTTPAddr(), filepath.Join(dir, "agent-1"), sock, d.Host())
	testutil.Eventually(t, waitLimit, "the agent's Docker network carve", func() error {
		var n struct{ IPAM struct{ Driver string } }
		if err := d.try(http.MethodGet, "/networks/carve", nil, &n); err != nil {
			return err
		}
		if n.IPAM.Driver != driverName {
			return fmt.Errorf("network carve's IPAM driver is %q", n.IPAM.Driver)
		}
		return nil
	})
	range1, _, _ := a1.IPAM().BridgeSubnets("carve", api.BridgeDocker)
	first, err := d.run(t, "carve")
	if err != nil {
		t.Fatalf("container on network carve: %v", err)
	}
	ep, err := d.Endpoint(ctx, first, "carve")
	if err != nil {
		t.Fatal(err)
	}
	held := netip.MustParseAddr(ep.IPAddress)
	firstName := containerName(t, d, first)
	t.Logf("container %s (%.12s) holds %s", firstName, first, held)

	// The agent restarts without its data dir, and reaches no master at
	// first (as when the masters answer slowly): the plugin follows the
	// engine long before the agent has restored its overlays.
	a1.stop()
	masters := startGate(t, m.HTTPAddr())
	a2 := startDockerAgent(t, host, masters.addr(), filepath.Join(dir, "agent-2"), sock, d.Host())
	testutil.Eventually(t, waitLimit, "the restarted agent's plugin follows the engine", testutil.True(func() bool {
		st := a2.Docker().Status()
		return st.Plugin.Serving && st.Engine.Connected && !st.GC.LastRun.IsZero()
	}))
	masters.open.Store(true)
	t.Log("the masters answer the restarted agent")
	testutil.Eventually(t, waitLimit, "the restarted agent serves overlay carve", testutil.True(func() bool {
		_, _, ok := a2.IPAM().BridgeSubnets("carve", api.BridgeDocker)
		return ok
	}))
	t.Log("the restarted agent serves overlay carve; docker run")
	second, err := d.run(t, "carve")
	if err != nil {
		t.Fatalf("container on network carve after the restart: %v", err)
	}
	t.Log("second container started")
	ep2, err := d.Endpoint(ctx, second, "carve")
	if err != nil {
		t.Fatal(err)
	}
	got := netip.MustParseAddr(ep2.IPAddress)
	if range2, _, _ := a2.IPAM().BridgeSubnets("carve", api.BridgeDocker); range2 != range1 {
		t.Fatalf("the restarted agent's docker range %s is not the first's %s: the test shows nothing", range2, range1)
	}
	if got == held {
		t.Fatalf("after the restart, docker run got %s, which the running container %s holds", got, firstName)
	}
	secondName := containerName(t, d, second)

	// Both containers are named as their addresses' owners.
	for _, c := range []struct {
		id, name string
		addr     netip.Addr
	}{{first, firstName, held}, {second, secondName, got}} {
		testutil.Eventually(t, waitLimit, "the owner of "+c.addr.String()+" recorded", func() error {
			for _, al := range a2.IPAM().List("carve").Allocations {
				for _, ip := range al.IPs {
					if p, err := netip.ParsePrefix(ip.Address); err == nil && p.Addr() == c.addr {
						if o := al.Owner; o == nil || o.ContainerID != c.id || o.ContainerName != c.name {
							return fmt.Errorf("%s is held by %s/%s, owner %+v", c.addr, al.ContainerID, al.IfName, o)
						}
						return nil
					}
				}
			}
			return fmt.Errorf("no allocation holds %s", c.addr)
		})
	}
	t.Log("owners recorded; docker run --ip of the taken address")
	if id, err := d.runWithIP(t, "carve", held); err == nil || !strings.Contains(err.Error(), "docker container "+firstName) {
		t.Errorf("docker run --ip %s: %v, want an error naming docker container %s", held, err, firstName)
		if err == nil {
			d.remove(t, id)
		}
	}
	d.remove(t, second)
	d.remove(t, first)
}

// TestRealDockerPoolWithoutSubnet: docker network create --ipam-driver
// carve --ipam-opt network=carve without --subnet, while carve's network
// carve exists, fails promptly naming it (before the fix dockerd asked for
// the pool forever and the call hung), and dockerd stays responsive.
func TestRealDockerPoolWithoutSubnet(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root: network namespaces and a Docker engine")
	bins, err := dockerlab.Binaries()
	testutil.Require(t, err == nil, "%v", err)
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	host := lab.Hosts()[0]
	a := realAgent(t, host)
	driverName := fmt.Sprintf("carve-test-%d", os.Getpid())
	pluginDir := filepath.Join(shortTempDir(t), "plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	engineDir := filepath.Join(shortTempDir(t), "engine")
	s := runService(t, a.IPAM(), dockeripam.Options{
		PluginSocket: filepath.Join(pluginDir, driverName+".sock"),
		DockerHost:   "unix://" + filepath.Join(engineDir, "docker.sock"),
		EngineRetry:  200 * time.Millisecond, GCInterval: time.Hour,
	})
	d := startEngine(t, host, engineDir, pluginDir, bins)
	testutil.Eventually(t, waitLimit, "network carve", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))

	// Bounded: a hang is the failure (dockerd never answered before the fix).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := map[string]any{"Name": "mine", "Driver": "bridge", "IPAM": map[string]any{"Driver": driverName, "Options": map[string]string{"network": "carve"}}}
	err = d.CallJSON(ctx, http.MethodPost, "/networks/create", body, nil)
	if err == nil || !strings.Contains(err.Error(), "docker run --net carve") {
		t.Fatalf("docker network create without --subnet: %v, want an error naming docker run --net carve", err)
	}
	t.Logf("refused: %v", err)
	// dockerd still answers, and its network carve is untouched.
	var n struct{ IPAM struct{ Driver string } }
	d.call(t, http.MethodGet, "/networks/carve", nil, &n)
	if n.IPAM.Driver != driverName {
		t.Errorf("network carve after the refusal: %+v", n)
	}
	if err := d.try(http.MethodGet, "/networks/mine", nil, nil); err == nil {
		t.Error("the refused network mine exists")
	}
}
