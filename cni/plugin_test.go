package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
)

// call is one CNI command for carve-ipam.
type call struct {
	cmd         string // ADD, DEL, CHECK, GC, STATUS
	conf        []byte
	containerID string
	ifName      string
}

// runner runs a call and returns ADD's result (nil otherwise) or the CNI error.
type runner func(t *testing.T, c call) (*types100.Result, *types.Error)

// runners run carve-ipam in-process (under the race detector) and as the
// binary a runtime executes (through libcni's invoke, with the CNI_*
// environment and the JSON error on stdout).
var runners = map[string]runner{"in-process": runInProcess, "binary": runBinary}

func runInProcess(t *testing.T, c call) (*types100.Result, *types.Error) {
	t.Helper()
	var out bytes.Buffer
	p := &Plugin{Stdout: &out}
	args := &skel.CmdArgs{ContainerID: c.containerID, Netns: "/nonexistent/netns", IfName: c.ifName, StdinData: c.conf}
	fn := map[string]func(*skel.CmdArgs) error{"ADD": p.Add, "DEL": p.Del, "CHECK": p.Check, "GC": p.GC, "STATUS": p.Status}[c.cmd]
	if err := fn(args); err != nil {
		var ce *types.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		return nil, types.NewError(types.ErrInternal, err.Error(), "") // as skel does
	}
	if c.cmd != "ADD" {
		if out.Len() != 0 {
			t.Errorf("%s printed %q", c.cmd, out.String())
		}
		return nil, nil
	}
	return decodeResult(t, c.conf, out.Bytes()), nil
}

func decodeResult(t *testing.T, conf, out []byte) *types100.Result {
	t.Helper()
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(conf, &v)
	r, err := version.NewResult(v.CNIVersion, out)
	if err != nil {
		t.Fatalf("decode result %s: %v", out, err)
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		t.Fatalf("convert result: %v", err)
	}
	return res
}

func runBinary(t *testing.T, c call) (*types100.Result, *types.Error) {
	t.Helper()
	path := pluginPath(t)
	args := &invoke.Args{Command: c.cmd, ContainerID: c.containerID, NetNS: "/nonexistent/netns", IfName: c.ifName, Path: strings.Join(path, string(filepath.ListSeparator))}
	plugin, err := invoke.FindInPath(netconf.PluginType, path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var res types.Result
	if c.cmd == "ADD" {
		res, err = invoke.ExecPluginWithResult(ctx, plugin, c.conf, args, nil)
	} else {
		err = invoke.ExecPluginWithoutResult(ctx, plugin, c.conf, args, nil)
	}
	if err != nil {
		var ce *types.Error
		if !errors.As(err, &ce) {
			t.Fatalf("%s: not a CNI error: %v", c.cmd, err)
		}
		return nil, ce
	}
	if res == nil {
		return nil, nil
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	return r, nil
}

// ipamConf is what a parent plugin hands carve-ipam: its own configuration
// with the ipam section, plus extra top-level keys (prevResult, GC list).
func ipamConf(t testing.TB, sock, network string, extra map[string]any) []byte {
	t.Helper()
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       network,
		"type":       "bridge",
		"bridge":     netconf.MesosBridge(network),
		"ipam":       map[string]any{"type": netconf.PluginType, "network": network, "socket": sock},
	}
	for k, v := range extra {
		conf[k] = v
	}
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prevResultOf renders addresses as a prevResult.
func prevResultOf(addrs ...string) map[string]any {
	var ips []any
	for _, a := range addrs {
		ips = append(ips, map[string]any{"address": a})
	}
	return map[string]any{"cniVersion": "1.1.0", "ips": ips}
}

func wantCNIError(t *testing.T, err *types.Error, code uint, msgs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want CNI error %d", code)
	}
	if err.Code != code {
		t.Fatalf("CNI error %d (%s); want %d", err.Code, err.Msg, code)
	}
	for _, m := range msgs {
		if !strings.Contains(err.Msg+" "+err.Details, m) {
			t.Errorf("CNI error %q (details %q) does not mention %q", err.Msg, err.Details, m)
		}
	}
}

// shortTempDir returns a fresh directory with a short path (a unix socket
// path must fit in 108 bytes), removed at the end of the test.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "carvecni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestPluginAgentUnreachable covers every command with no agent behind the
// socket: ADD must answer "try again later", DEL must fail (so the runtime
// retries and nothing leaks), STATUS "plugin not available".
func TestPluginAgentUnreachable(t *testing.T) {
	absent := filepath.Join(shortTempDir(t), "agent.sock")

	// A stale socket: the file exists, nobody listens (an agent that died).
	stale := filepath.Join(shortTempDir(t), "agent.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	prev := map[string]any{"prevResult": prevResultOf("10.1.0.2/25")}
	gc := map[string]any{"cni.dev/valid-attachments": []any{}}
	tests := []struct {
		cmd   string
		extra map[string]any
		code  uint
	}{
		{"ADD", nil, types.ErrTryAgainLater},
		{"DEL", nil, types.ErrTryAgainLater},
		{"CHECK", prev, types.ErrTryAgainLater},
		{"GC", gc, types.ErrTryAgainLater},
		{"STATUS", nil, types.ErrPluginNotAvailable},
	}
	for rname, run := range runners {
		for sname, sock := range map[string]string{"absent": absent, "stale": stale} {
			for _, tc := range tests {
				t.Run(rname+"/"+sname+"/"+tc.cmd, func(t *testing.T) {
					res, cerr := run(t, call{tc.cmd, ipamConf(t, sock, "ov", tc.extra), "c1", "eth0"})
					if res != nil {
						t.Fatalf("%s succeeded with %v", tc.cmd, res)
					}
					wantCNIError(t, cerr, tc.code, sock)
				})
			}
		}
	}
}

// TestPluginAgainstAgent runs every command against a real agent: ADD gets
// the lowest free address, idempotently; CHECK and DEL follow the agent's
// allocations; the agent's refusals become the CNI codes a runtime acts on.
func TestPluginAgainstAgent(t *testing.T) {
	t.Parallel()
	for rname, run := range runners {
		t.Run(rname, func(t *testing.T) {
			a := startAgent(t, true)
			a.fillTiny(t)
			conf := func(network string, extra map[string]any) []byte { return ipamConf(t, a.Sock, network, extra) }

			// ADD: the lowest free address after the gateway, with the
			// prefix, the gateway, the default route and no interfaces.
			res, cerr := run(t, call{"ADD", conf("ov", nil), "c1", "eth0"})
			if cerr != nil {
				t.Fatalf("ADD: %v", cerr)
			}
			if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.0.2/25" || res.IPs[0].Gateway.String() != "10.1.0.1" || res.IPs[0].Interface != nil {
				t.Fatalf("ADD result IPs = %v", res.IPs)
			}
			if len(res.Interfaces) != 0 {
				t.Errorf("an IPAM plugin returned interfaces: %v", res.Interfaces)
			}
			if len(res.Routes) != 1 || res.Routes[0].Dst.String() != "0.0.0.0/0" || res.Routes[0].GW.String() != "10.1.0.1" {
				t.Errorf("ADD routes = %v", res.Routes)
			}
			// Retried ADD: the same address; another interface: the next one.
			if again, cerr := run(t, call{"ADD", conf("ov", nil), "c1", "eth0"}); cerr != nil || again.IPs[0].Address.String() != "10.1.0.2/25" {
				t.Errorf("retried ADD = %v, %v", again, cerr)
			}
			if other, cerr := run(t, call{"ADD", conf("ov", nil), "c1", "eth1"}); cerr != nil || other.IPs[0].Address.String() != "10.1.0.3/25" {
				t.Errorf("ADD eth1 = %v, %v", other, cerr)
			}
			// An older config version gets its result in that version.
			old := ipamConf(t, a.Sock, "ov", map[string]any{"cniVersion": "0.4.0"})
			if r040, cerr := run(t, call{"ADD", old, "c2", "eth0"}); cerr != nil || r040.IPs[0].Address.String() != "10.1.0.4/25" {
				t.Errorf("ADD with cniVersion 0.4.0 = %v, %v", r040, cerr)
			}

			// CHECK of the right address passes.
			if _, cerr := run(t, call{"CHECK", conf("ov", map[string]any{"prevResult": prevResultOf("10.1.0.2/25")}), "c1", "eth0"}); cerr != nil {
				t.Errorf("CHECK of the right address: %v", cerr)
			}

			// DEL frees; DEL again, of an unknown container, or of an
			// overlay the agent does not have, succeeds.
			for _, c := range []call{
				{"DEL", conf("ov", nil), "c1", "eth0"},
				{"DEL", conf("ov", nil), "c1", "eth0"},
				{"DEL", conf("ov", nil), "never-added", "eth0"},
				{"DEL", conf("gone", nil), "c1", "eth0"},
			} {
				if _, cerr := run(t, c); cerr != nil {
					t.Errorf("DEL %s %s: %v", c.containerID, c.ifName, cerr)
				}
			}
			if got, want := a.Keys(t, "ov"), []string{"c1/eth1", "c2/eth0"}; !slices.Equal(got, want) {
				t.Errorf("after DEL the agent holds %v, want %v", got, want)
			}
			_, cerr = run(t, call{"CHECK", conf("ov", map[string]any{"prevResult": prevResultOf("10.1.0.2/25")}), "c1", "eth0"})
			wantCNIError(t, cerr, types.ErrInternal, "holds no address", "c1")

			// The agent's refusals: an overlay it does not have, a full
			// bridge (tiny's mesos bridge has five addresses).
			_, cerr = run(t, call{"ADD", conf("nope", nil), "c1", "eth0"})
			wantCNIError(t, cerr, types.ErrInvalidNetworkConfig, `unknown network "nope"`)
			for i := range 5 {
				if _, cerr := run(t, call{"ADD", conf("tiny", nil), fmt.Sprint("t", i), "eth0"}); cerr != nil {
					t.Fatalf("ADD %d on tiny: %v", i, cerr)
				}
			}
			_, cerr = run(t, call{"ADD", conf("tiny", nil), "t5", "eth0"})
			wantCNIError(t, cerr, types.ErrInternal, "exhausted", tinyMesos.String())

			// STATUS: ready on the agent's overlays, not on others.
			if _, cerr := run(t, call{"STATUS", conf("ov", nil), "", ""}); cerr != nil {
				t.Errorf("STATUS ov: %v", cerr)
			}
			_, cerr = run(t, call{"STATUS", conf("nope", nil), "", ""})
			wantCNIError(t, cerr, types.ErrPluginNotAvailable, `unknown network "nope"`)
		})
	}
}

// TestPluginAgentNotReady: an agent that has no lease yet (no master has
// answered it) makes ADD "try again later" and STATUS "not available"; DEL
// succeeds; once it registers, ADD and STATUS work.
func TestPluginAgentNotReady(t *testing.T) {
	t.Parallel()
	a := startAgent(t, false)
	for rname, run := range runners {
		t.Run(rname, func(t *testing.T) {
			_, cerr := run(t, call{"ADD", ipamConf(t, a.Sock, "ov", nil), "c1", "eth0"})
			wantCNIError(t, cerr, types.ErrTryAgainLater, api.CodeNotReady)
			// DEL works without a lease: the agent drops whatever it kept
			// of the attachment on disk.
			if _, cerr := run(t, call{"DEL", ipamConf(t, a.Sock, "ov", nil), "c1", "eth0"}); cerr != nil {
				t.Errorf("DEL without a lease: %v", cerr)
			}
			_, cerr = run(t, call{"STATUS", ipamConf(t, a.Sock, "ov", nil), "", ""})
			wantCNIError(t, cerr, types.ErrPluginNotAvailable, "not ready")
		})
	}
	a.StartMasters(t)
	for rname, run := range runners {
		t.Run(rname+"/ready", func(t *testing.T) {
			if _, cerr := run(t, call{"STATUS", ipamConf(t, a.Sock, "ov", nil), "", ""}); cerr != nil {
				t.Errorf("STATUS once registered: %v", cerr)
			}
			if _, cerr := run(t, call{"ADD", ipamConf(t, a.Sock, "ov", nil), "c-" + rname, "eth0"}); cerr != nil {
				t.Errorf("ADD once registered: %v", cerr)
			}
		})
	}
}

// TestPluginCheck compares the agent's addresses with prevResult.
func TestPluginCheck(t *testing.T) {
	t.Parallel()
	a := startAgent(t, true)
	if al, err := a.ipam.Allocate(bounded(t), api.IPAMRequest{Network: "ov", ContainerID: "c1", IfName: "eth0"}); err != nil || al.IPs[0].Address != "10.1.0.2/25" {
		t.Fatalf("allocate c1/eth0 = %v, %v; want 10.1.0.2/25", al, err)
	}
	tests := []struct {
		name  string
		extra map[string]any
		code  uint
		msg   string
	}{
		{"same", map[string]any{"prevResult": prevResultOf("10.1.0.2/25")}, 0, ""},
		{"same with gateway", map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0", "ips": []any{map[string]any{"address": "10.1.0.2/25", "gateway": "10.1.0.1"}}}}, 0, ""},
		{"other address", map[string]any{"prevResult": prevResultOf("10.1.0.9/25")}, types.ErrInternal, "10.1.0.2/25 missing from prevResult"},
		{"other prefix", map[string]any{"prevResult": prevResultOf("10.1.0.2/24")}, types.ErrInternal, "10.1.0.2/24 not held by the agent"},
		{"extra address", map[string]any{"prevResult": prevResultOf("10.1.0.2/25", "10.1.0.3/25")}, types.ErrInternal, "10.1.0.3/25 not held"},
		{"no addresses", map[string]any{"prevResult": prevResultOf()}, types.ErrInternal, "missing from prevResult"},
		{"other gateway", map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0", "ips": []any{map[string]any{"address": "10.1.0.2/25", "gateway": "10.1.0.126"}}}}, types.ErrInternal, "gateway 10.1.0.126, agent has 10.1.0.1"},
		{"no prevResult", nil, types.ErrInvalidNetworkConfig, "prevResult"},
		{"garbage prevResult", map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0", "ips": []any{map[string]any{"address": "nope"}}}}, types.ErrDecodingFailure, "prevResult"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, cerr := runInProcess(t, call{"CHECK", ipamConf(t, a.Sock, "ov", tc.extra), "c1", "eth0"})
			if tc.code == 0 {
				if cerr != nil {
					t.Fatalf("CHECK: %v", cerr)
				}
				return
			}
			wantCNIError(t, cerr, tc.code, tc.msg)
		})
	}
}

// TestPluginGC frees exactly the allocations that are not listed, across
// bridges and interfaces, and refuses a GC without a list.
func TestPluginGC(t *testing.T) {
	t.Parallel()
	for rname, run := range runners {
		t.Run(rname, func(t *testing.T) {
			a := startAgent(t, true)
			cl := a.ipam
			for _, k := range []string{"a/eth0", "b/eth0", "b/eth1", "c/eth0", "c/eth1", "d/eth0"} {
				cid, ifn, _ := strings.Cut(k, "/")
				for _, network := range []string{"ov", "other"} {
					if _, err := cl.Allocate(context.Background(), api.IPAMRequest{Network: network, ContainerID: cid, IfName: ifn}); err != nil {
						t.Fatal(err)
					}
				}
			}
			_, cerr := run(t, call{"GC", ipamConf(t, a.Sock, "ov", nil), "", ""})
			wantCNIError(t, cerr, types.ErrInvalidNetworkConfig, "valid-attachments")
			if got := len(a.Keys(t, "ov")); got != 6 {
				t.Fatalf("a refused GC changed the allocations: %d left", got)
			}

			valid := []types.GCAttachment{{ContainerID: "a", IfName: "eth0"}, {ContainerID: "b", IfName: "eth1"}, {ContainerID: "c", IfName: ""}}
			if _, cerr := run(t, call{"GC", ipamConf(t, a.Sock, "ov", map[string]any{"cni.dev/valid-attachments": valid}), "", ""}); cerr != nil {
				t.Fatalf("GC: %v", cerr)
			}
			if got, want := a.Keys(t, "ov"), []string{"a/eth0", "b/eth1", "c/eth0", "c/eth1"}; !slices.Equal(got, want) {
				t.Errorf("after GC the agent holds %v, want %v", got, want)
			}
			if got := len(a.Keys(t, "other")); got != 6 {
				t.Errorf("GC of ov touched another overlay: %d left of 6", got)
			}
			// Nothing live: everything goes.
			if _, cerr := run(t, call{"GC", ipamConf(t, a.Sock, "ov", map[string]any{"cni.dev/valid-attachments": nil}), "", ""}); cerr != nil {
				t.Fatalf("GC with null list: %v", cerr)
			}
			if got := a.Keys(t, "ov"); len(got) != 0 {
				t.Errorf("after GC of nothing live the agent holds %v", got)
			}
		})
	}
}

func TestPluginVersion(t *testing.T) {
	plugin, err := invoke.FindInPath(netconf.PluginType, pluginPath(t))
	if err != nil {
		t.Fatal(err)
	}
	info, err := invoke.GetVersionInfo(context.Background(), plugin, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		if !slices.Contains(info.SupportedVersions(), v) {
			t.Errorf("carve-ipam does not support CNI %s: %v", v, info.SupportedVersions())
		}
	}
}

// TestResultFromAllocation refuses what the agent should never send rather
// than handing the runtime a broken result.
func TestResultFromAllocation(t *testing.T) {
	tests := []struct {
		name string
		in   *api.Allocation
		err  string
	}{
		{"nil", nil, "no address"},
		{"no ips", &api.Allocation{}, "no address"},
		{"bad address", &api.Allocation{IPs: []api.IPConfig{{Address: "10.0.0.2"}}}, `address "10.0.0.2"`},
		{"bad gateway", &api.Allocation{IPs: []api.IPConfig{{Address: "10.0.0.2/24", Gateway: "x"}}}, `gateway "x"`},
		{"bad route", &api.Allocation{IPs: []api.IPConfig{{Address: "10.0.0.2/24"}}, Routes: []api.Route{{Dst: "default"}}}, `route destination "default"`},
		{"bad route gw", &api.Allocation{IPs: []api.IPConfig{{Address: "10.0.0.2/24"}}, Routes: []api.Route{{Dst: "0.0.0.0/0", GW: "y"}}}, `gateway "y"`},
		{"dual stack", &api.Allocation{IPs: []api.IPConfig{{Address: "10.0.0.2/24", Gateway: "10.0.0.1"}, {Address: "fd00::2/64", Gateway: "fd00::1"}},
			Routes: []api.Route{{Dst: "0.0.0.0/0", GW: "10.0.0.1"}, {Dst: "::/0", GW: "fd00::1"}}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ResultFromAllocation(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ResultFromAllocation = %v, %v; want error with %q", res, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(res.IPs) != 2 || res.IPs[1].Address.String() != "fd00::2/64" || len(res.Routes) != 2 || res.Routes[1].Dst.String() != "::/0" {
				t.Errorf("result = %+v", res)
			}
		})
	}
}
