package ipamcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/unixsock"
)

// ipamSocket serves a real IPAM service (on a store of the test) at a
// unix socket, for an agent holding 10.128.2.0/23 on the overlay carve.
func ipamSocket(t *testing.T) (string, *api.IPAMClient) {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := ipam.New(ipam.Config{AgentID: "h1", DB: db, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	self := &api.AgentInfo{AgentID: "h1", IP: "198.18.0.11", Version: 3, Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/16", Prefix: 23},
		Subnet:       "10.128.2.0/23",
		MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: "10.128.2.0/24"},
		DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: "10.128.3.0/24"},
		State:        api.OverlayState{Status: api.StatusOK},
	}}}
	svc.Sync(ipam.View{Self: self, Network: &api.NetworkConfig{OverlayMTU: 1420},
		Peers: []ipam.Peer{{ID: "h1", Version: 3, Subnets: []string{"10.128.2.0/23"}}}})
	sock := filepath.Join(dir, "agent.sock")
	ln, err := unixsock.Listen(sock, os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		svc.Serve(ctx, ln)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		db.Close()
	})
	return sock, api.NewIPAMClient(sock, 10*time.Second)
}

// TestIPAMRelease: issue 20, finding 7. A leak is released with carve
// ipam release, by container, by interface or by address, through the
// agent's IPAM socket; an unknown attachment is an error saying so.
func TestIPAMRelease(t *testing.T) {
	ctx := context.Background()
	sock, client := ipamSocket(t)
	ip := map[string]string{}
	for _, at := range []struct{ cid, ifname string }{{"leak1", "eth0"}, {"leak1", "eth1"}, {"leak2", "eth0"}, {"leak3", "eth0"}, {"live", "eth0"}} {
		a, err := client.Allocate(ctx, api.IPAMRequest{Network: "carve", ContainerID: at.cid, IfName: at.ifname})
		if err != nil {
			t.Fatal(err)
		}
		ip[at.cid+"/"+at.ifname] = strings.Split(a.IPs[0].Address, "/")[0]
	}
	release := func(args ...string) (ipamReleaseReport, error) {
		var out bytes.Buffer
		err := runIPAMRelease(ctx, append([]string{"--socket", sock, "--json"}, args...), &out)
		var rep ipamReleaseReport
		if err == nil {
			if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
				t.Fatalf("%s: %v", out.String(), jerr)
			}
		}
		return rep, err
	}
	names := func(rep ipamReleaseReport) string {
		var out []string
		for _, a := range rep.Released {
			out = append(out, a.ContainerID+"/"+a.IfName)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // released, or the error
	}{
		{"one interface", []string{"--container-id", "leak1", "--ifname", "eth1"}, "leak1/eth1"},
		{"every interface of a container", []string{"--container-id", "leak1", "--network", "carve"}, "leak1/eth0"},
		{"by address", []string{"--ip", ip["leak2/eth0"]}, "leak2/eth0"},
		{"unknown container", []string{"--container-id", "nope"}, `no such attachment: the agent at ` + sock + ` holds no attachment of container "nope" on any overlay (it holds 2)`},
		{"released twice", []string{"--ip", ip["leak2/eth0"]}, "no such attachment: the agent at " + sock + " holds no attachment of address " + ip["leak2/eth0"]},
		{"another overlay", []string{"--container-id", "leak3", "--network", "other"}, `holds no attachment of container "leak3" on overlay "other"`},
		{"neither", nil, "usage: give --container-id ID or --ip ADDR"},
		{"both", []string{"--container-id", "leak3", "--ip", ip["leak3/eth0"]}, "usage: give --container-id ID or --ip ADDR"},
		{"bad address", []string{"--ip", "10.128.2"}, `usage: --ip "10.128.2" is not an IP address`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := release(tc.args...)
			switch {
			case err != nil && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %v, want %q", err, tc.want)
			case err != nil && cli.ExitCode(err) == 0:
				t.Errorf("error %v exits 0", err)
			case err == nil && names(rep) != tc.want:
				t.Errorf("released %q, want %q", names(rep), tc.want)
			}
		})
	}
	left, err := client.List(ctx, "carve")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, a := range left.Allocations {
		kept = append(kept, a.ContainerID+"/"+a.IfName)
	}
	if strings.Join(kept, " ") != "leak3/eth0 live/eth0" {
		t.Errorf("the agent holds %q after the releases, want leak3/eth0 live/eth0", kept)
	}
	if _, err := release("--socket", filepath.Join(t.TempDir(), "none.sock"), "--container-id", "x"); !errors.Is(err, api.ErrAgentUnreachable) {
		t.Errorf("no agent: %v, want %v", err, api.ErrAgentUnreachable)
	}
}
