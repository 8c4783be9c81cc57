// Package cni is the carve-ipam CNI plugin (cmd/carve-ipam): a thin CNI
// front, ADD, DEL, CHECK, GC, STATUS and VERSION, for the agent's IPAM
// service on its unix socket (api.IPAMClient). The network configuration
// lists that name it are written by package cni/netconf.
package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/carve-net/carve/api"
)

// DefaultTimeout bounds one call to the agent. The agent allocates locally,
// so it only matters when the agent hangs; the runtime then retries.
const DefaultTimeout = 30 * time.Second

// Versions are the CNI spec versions carve-ipam answers: all of them, as
// results convert down from 1.1.0.
var Versions = version.All

// carve-ipam's own error codes (the spec leaves 100 and up to plugins):
// why a requested address (runtimeConfig.ips, IP= of CNI_ARGS) cannot be
// given. The message names the holder or the agent whose space it is.
const (
	// ErrAddressTaken: another container holds the requested address.
	ErrAddressTaken uint = 1000
	// ErrAddressNotHere: the requested address is not this host's space
	// (another agent's, or outside the overlay).
	ErrAddressNotHere uint = 1001
	// ErrBridgeAddress: the requested address is a network, broadcast or
	// gateway address of the bridge.
	ErrBridgeAddress uint = 1002
)

// Plugin is carve-ipam: each CNI command becomes one call to the agent's IPAM
// service. The zero value is ready to use.
type Plugin struct {
	// Timeout bounds each call to the agent (DefaultTimeout when zero).
	Timeout time.Duration
	// Stdout receives ADD's result (os.Stdout when nil), so that tests can
	// run the commands in-process.
	Stdout io.Writer
}

// Funcs returns the plugin's commands for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

func (p *Plugin) client(cfg *Config) *api.IPAMClient {
	return api.NewIPAMClient(cfg.Socket, p.timeout())
}

func (p *Plugin) timeout() time.Duration {
	if p.Timeout > 0 {
		return p.Timeout
	}
	return DefaultTimeout
}

func (p *Plugin) stdout() io.Writer {
	if p.Stdout != nil {
		return p.Stdout
	}
	return os.Stdout
}

func (p *Plugin) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.timeout())
}

// attachmentConfig parses the configuration of a command that names one
// attachment (ADD, DEL, CHECK) and checks that it does.
func attachmentConfig(args *skel.CmdArgs) (*Config, error) {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, err
	}
	if err := requireAttachment(args); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (cfg *Config) request(args *skel.CmdArgs) api.IPAMRequest {
	return api.IPAMRequest{Network: cfg.Network, ContainerID: args.ContainerID, IfName: args.IfName, Bridge: cfg.Bridge}
}

// allocateRequest is ADD's request: the attachment with its owner as the
// runtime gave it (CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS and the
// identity of CNI_ARGS) and the addresses it asks for (runtimeConfig.ips,
// args.cni.ips, IP= of CNI_ARGS). A bad CNI_ARGS is error 4 (invalid
// environment variables) naming the pair; requests that disagree are 7.
func (cfg *Config) allocateRequest(args *skel.CmdArgs) (api.IPAMRequest, error) {
	req := cfg.request(args)
	parsed, err := api.ParseCNIArgs(args.Args)
	if err != nil {
		return req, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("carve-ipam: CNI_ARGS: %v (want KEY=VALUE;KEY=VALUE, printable, at most 4096 bytes)", err), "")
	}
	owner := parsed.Owner
	owner.Runtime, owner.ContainerID, owner.IfName, owner.NetNS = api.RuntimeCNI, args.ContainerID, args.IfName, args.Netns
	if err := owner.Validate(); err != nil {
		return req, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("carve-ipam: %v (CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS)", err), "")
	}
	req.Owner = &owner
	ips := slices.Clone(cfg.IPs)
	for _, a := range parsed.IPs {
		ips = append(ips, a.String())
	}
	wanted, err := api.ParseRequestedIPs(dedupeAddrs(ips))
	if err != nil {
		return req, invalidConfig("requested addresses (runtimeConfig.ips, args.cni.ips and IP= of CNI_ARGS together): %v", err)
	}
	for _, a := range wanted {
		req.Addresses = append(req.Addresses, a.String())
	}
	return req, nil
}

// dedupeAddrs drops the repeats of an address asked for twice (with and
// without a prefix, or by two sources).
func dedupeAddrs(list []string) []string {
	var out []string
	seen := map[netip.Addr]bool{}
	for _, s := range list {
		a, err := api.ParseHostAddr(s)
		if err == nil && seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, s)
	}
	return out
}

// Add allocates the attachment's addresses (the agent is idempotent by
// network, container id and interface, so a retried ADD gets the same ones)
// and prints them as a CNI result with the agent's routes and no interfaces.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	cfg, err := attachmentConfig(args)
	if err != nil {
		return err
	}
	req, err := cfg.allocateRequest(args)
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	alloc, err := p.client(cfg).Allocate(ctx, req)
	if err != nil {
		return agentError(cfg, "ADD", err)
	}
	res, err := ResultFromAllocation(alloc)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("carve-ipam: agent at %s: %v", cfg.Socket, err), "")
	}
	ver := cfg.CNIVersion
	if ver == "" {
		ver = types100.ImplementedSpecVersion
	}
	out, err := res.GetAsVersion(ver)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("carve-ipam: result as version %s: %v", ver, err), "")
	}
	if err := out.PrintTo(p.stdout()); err != nil {
		return types.NewError(types.ErrIOFailure, "carve-ipam: print result: "+err.Error(), "")
	}
	return nil
}

// Del releases the attachment's addresses. Releasing an unknown attachment
// succeeds; an unreachable agent fails the DEL, so that the runtime retries
// and no address leaks.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	cfg, err := attachmentConfig(args)
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	if _, err := p.client(cfg).Release(ctx, cfg.request(args)); err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
			// The overlay is gone from the agent: nothing of it is left to free.
			return nil
		}
		return agentError(cfg, "DEL", err)
	}
	return nil
}

// Check verifies that the agent still holds exactly the addresses of the
// attachment's previous result.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	cfg, err := attachmentConfig(args)
	if err != nil {
		return err
	}
	if cfg.PrevResult == nil {
		return invalidConfig("CHECK needs a prevResult")
	}
	prev, err := parsePrevResult(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	alloc, err := p.client(cfg).Lookup(ctx, cfg.request(args))
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
			return types.NewError(types.ErrInternal, fmt.Sprintf("carve-ipam: CHECK: the agent holds no address for container %s interface %s on %s",
				args.ContainerID, args.IfName, cfg.Network), ae.Message)
		}
		return agentError(cfg, "CHECK", err)
	}
	want, err := ResultFromAllocation(alloc)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("carve-ipam: agent at %s: %v", cfg.Socket, err), "")
	}
	if err := compareIPs(want.IPs, prev.IPs); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("carve-ipam: CHECK container %s interface %s on %s: %v",
			args.ContainerID, args.IfName, cfg.Network, err), "")
	}
	return nil
}

// GC releases every allocation of the network that is not among the
// runtime's valid attachments. A GC without the list is refused rather than
// taken as "nothing is valid", which would free every address in use.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if !cfg.HasAttachments {
		return invalidConfig("GC without cni.dev/valid-attachments: refusing to release every address of %s", cfg.Network)
	}
	req := api.GCRequest{Network: cfg.Network, Bridge: cfg.Bridge, Keep: make([]api.IPAMRequest, 0, len(cfg.ValidAttachments))}
	for _, a := range cfg.ValidAttachments {
		req.Keep = append(req.Keep, api.IPAMRequest{Network: cfg.Network, ContainerID: a.ContainerID, IfName: a.IfName})
	}
	ctx, cancel := p.context()
	defer cancel()
	if _, err := p.client(cfg).GC(ctx, req); err != nil {
		return agentError(cfg, "GC", err)
	}
	return nil
}

// Status answers ErrPluginNotAvailable while ADD cannot work: the agent is
// unreachable, or has no lease for the overlay yet.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	st, err := p.client(cfg).Status(ctx, cfg.Network)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("carve-ipam: overlay %s: %v", cfg.Network, err), "")
	}
	if !st.Ready {
		msg := fmt.Sprintf("carve-ipam: overlay %s is not ready on the agent at %s", cfg.Network, cfg.Socket)
		if st.Error != "" {
			msg += ": " + st.Error
		}
		return types.NewError(types.ErrPluginNotAvailable, msg, "")
	}
	return nil
}

// requireAttachment refuses a call without the attachment's identity, which
// the agent keys everything on. skel already checks the environment; this
// guards direct callers.
func requireAttachment(args *skel.CmdArgs) error {
	if args.ContainerID == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "carve-ipam: CNI_CONTAINERID is empty", "")
	}
	if args.IfName == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "carve-ipam: CNI_IFNAME is empty", "")
	}
	return nil
}

// agentError turns a failed agent call into the CNI error a runtime acts on:
// 11 (try again later) while the agent is unreachable or not ready, 7 when it
// rejects the network, ErrAddressTaken, ErrAddressNotHere or
// ErrBridgeAddress when a requested address cannot be given, 999
// otherwise, always with the agent's message.
func agentError(cfg *Config, cmd string, err error) *types.Error {
	if errors.Is(err, api.ErrAgentUnreachable) {
		return types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("carve-ipam: %s on %s: carve agent unreachable at %s (is `carve agent` running?)", cmd, cfg.Network, cfg.Socket),
			err.Error())
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		msg := fmt.Sprintf("carve-ipam: %s on %s: agent answered %s: %s", cmd, cfg.Network, ae.Code, ae.Message)
		switch ae.Code {
		case api.CodeNotReady, api.CodeTimeout, api.CodeUnavailable, api.CodeNoLeader:
			return types.NewError(types.ErrTryAgainLater, msg, "")
		case api.CodeBadRequest, api.CodeNotFound:
			return types.NewError(types.ErrInvalidNetworkConfig, msg, "")
		case api.CodeTaken:
			return types.NewError(ErrAddressTaken, msg, "")
		case api.CodeNotOwned:
			return types.NewError(ErrAddressNotHere, msg, "")
		case api.CodeBridgeAddress:
			return types.NewError(ErrBridgeAddress, msg, "")
		default:
			return types.NewError(types.ErrInternal, msg, "")
		}
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("carve-ipam: %s on %s: %v", cmd, cfg.Network, err), "")
}

// ResultFromAllocation converts the agent's answer to a CNI result: the
// addresses with their prefix and gateway, the routes, and no interfaces (an
// IPAM plugin does not create any; the parent plugin fills them in).
func ResultFromAllocation(a *api.Allocation) (*types100.Result, error) {
	if a == nil || len(a.IPs) == 0 {
		return nil, errors.New("the allocation has no address")
	}
	res := &types100.Result{CNIVersion: types100.ImplementedSpecVersion}
	for _, ipc := range a.IPs {
		ip, ipnet, err := net.ParseCIDR(ipc.Address)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", ipc.Address, err)
		}
		ipnet.IP = ip
		cfg := &types100.IPConfig{Address: *ipnet}
		if ipc.Gateway != "" {
			gw := net.ParseIP(ipc.Gateway)
			if gw == nil {
				return nil, fmt.Errorf("gateway %q of %s is not an IP", ipc.Gateway, ipc.Address)
			}
			cfg.Gateway = gw
		}
		res.IPs = append(res.IPs, cfg)
	}
	for _, r := range a.Routes {
		_, dst, err := net.ParseCIDR(r.Dst)
		if err != nil {
			return nil, fmt.Errorf("route destination %q: %w", r.Dst, err)
		}
		route := &types.Route{Dst: *dst}
		if r.GW != "" {
			if route.GW = net.ParseIP(r.GW); route.GW == nil {
				return nil, fmt.Errorf("route %s: gateway %q is not an IP", r.Dst, r.GW)
			}
		}
		res.Routes = append(res.Routes, route)
	}
	return res, nil
}

// parsePrevResult reads the prevResult of a CHECK call as a 1.x result.
func parsePrevResult(stdin []byte) (*types100.Result, error) {
	conf := &types.PluginConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "carve-ipam: decode network configuration: "+err.Error(), "")
	}
	if err := version.ParsePrevResult(conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "carve-ipam: decode prevResult: "+err.Error(), "")
	}
	res, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "carve-ipam: convert prevResult: "+err.Error(), "")
	}
	return res, nil
}

// compareIPs reports a difference between the agent's addresses and the
// runtime's: the address sets (with prefix) must be equal, and gateways
// that both sides name must match.
func compareIPs(agent, prev []*types100.IPConfig) error {
	have := make(map[string]*types100.IPConfig, len(prev))
	for _, p := range prev {
		have[p.Address.String()] = p
	}
	var missing, extra, gw []string
	seen := make(map[string]bool, len(agent))
	for _, a := range agent {
		k := a.Address.String()
		seen[k] = true
		p, ok := have[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		if a.Gateway != nil && p.Gateway != nil && !a.Gateway.Equal(p.Gateway) {
			gw = append(gw, fmt.Sprintf("%s: gateway %s, agent has %s", k, p.Gateway, a.Gateway))
		}
	}
	for k := range have {
		if !seen[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, "the agent's "+strings.Join(missing, ", ")+" missing from prevResult")
	}
	if len(extra) > 0 {
		problems = append(problems, "prevResult's "+strings.Join(extra, ", ")+" not held by the agent")
	}
	problems = append(problems, gw...)
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}
