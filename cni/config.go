package cni

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
)

// Config is what carve-ipam reads from the network configuration it is
// invoked with (the parent plugin's configuration, carrying the "ipam" section).
type Config struct {
	// CNIVersion is the configuration's version, the one results are printed in.
	CNIVersion string
	// Name is the network name.
	Name string
	// Network is the overlay the agent allocates on (ipam.network).
	Network string
	// Bridge is the bridge kind, api.BridgeMesos (default) or api.BridgeDocker (ipam.bridge).
	Bridge string
	// Socket is the agent's IPAM socket (ipam.socket, default netconf.DefaultSocket).
	Socket string
	// ValidAttachments is the GC call's cni.dev/valid-attachments, nil when
	// the configuration has none (HasAttachments tells absent from empty).
	ValidAttachments []types.GCAttachment
	// HasAttachments is true when the configuration carries the list, even empty.
	HasAttachments bool
	// PrevResult is the raw prevResult (CHECK), nil when absent.
	PrevResult map[string]any
	// IPs are the requested addresses of the "ips" capability
	// (runtimeConfig.ips) and of args.cni.ips, with or without a prefix.
	IPs []string
}

// ipamSection is the "ipam" object; unknown keys are allowed, as CNI expects.
type ipamSection struct {
	Type    string `json:"type"`
	Network string `json:"network"`
	Bridge  string `json:"bridge"`
	Socket  string `json:"socket"`
}

type netConf struct {
	CNIVersion string          `json:"cniVersion"`
	Name       string          `json:"name"`
	IPAM       *ipamSection    `json:"ipam"`
	PrevResult map[string]any  `json:"prevResult"`
	Valid      json.RawMessage `json:"cni.dev/valid-attachments"`
	// Legacy is the name libcni also sends, after a spec typo (#1101).
	Legacy json.RawMessage `json:"cni.dev/attachments"`
	// RuntimeConfig carries the capabilities the runtime filled in; the
	// parent plugin (bridge) passes its whole configuration, runtimeConfig
	// included, to its IPAM plugin.
	RuntimeConfig struct {
		IPs []string `json:"ips"`
	} `json:"runtimeConfig"`
	// Args is the CNI conventions' "args" (args.cni.ips as host-local reads it).
	Args struct {
		CNI struct {
			IPs []string `json:"ips"`
		} `json:"cni"`
	} `json:"args"`
}

// invalidConfig is the CNI error for a configuration carve-ipam cannot use.
func invalidConfig(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("carve-ipam: "+format, a...), "")
}

// ParseConfig reads carve-ipam's configuration from the stdin of a CNI call.
// Errors are *types.Error: ErrDecodingFailure for malformed JSON,
// ErrInvalidNetworkConfig naming the field for a missing or invalid one.
func ParseConfig(stdin []byte) (*Config, error) {
	var nc netConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "carve-ipam: decode network configuration: "+err.Error(), "")
	}
	if nc.IPAM == nil {
		return nil, invalidConfig(`network configuration has no "ipam" section`)
	}
	ip := nc.IPAM
	if ip.Type != "" && ip.Type != netconf.PluginType {
		return nil, invalidConfig("ipam.type is %q, want %q", ip.Type, netconf.PluginType)
	}
	if ip.Network == "" {
		return nil, invalidConfig("ipam.network is missing: it names the carve overlay")
	}
	if err := api.ValidateOverlayName(ip.Network); err != nil {
		return nil, invalidConfig("ipam.network: %v", err)
	}
	cfg := &Config{
		CNIVersion: nc.CNIVersion,
		Name:       nc.Name,
		Network:    ip.Network,
		Bridge:     ip.Bridge,
		Socket:     ip.Socket,
		PrevResult: nc.PrevResult,
	}
	for _, list := range []struct {
		field string
		ips   []string
	}{{"runtimeConfig.ips", nc.RuntimeConfig.IPs}, {"args.cni.ips", nc.Args.CNI.IPs}} {
		if _, err := api.ParseRequestedIPs(list.ips); err != nil {
			return nil, invalidConfig("%s: %v", list.field, err)
		}
		cfg.IPs = append(cfg.IPs, list.ips...)
	}
	switch cfg.Bridge {
	case "":
		cfg.Bridge = api.BridgeMesos
	case api.BridgeMesos, api.BridgeDocker:
	default:
		return nil, invalidConfig("ipam.bridge is %q, want %q or %q", ip.Bridge, api.BridgeMesos, api.BridgeDocker)
	}
	if cfg.Socket == "" {
		cfg.Socket = netconf.DefaultSocket
	} else if !filepath.IsAbs(cfg.Socket) {
		return nil, invalidConfig("ipam.socket %q is not an absolute path", ip.Socket)
	}
	raw := nc.Valid
	if raw == nil {
		raw = nc.Legacy
	}
	if raw != nil {
		cfg.HasAttachments = true
		if err := json.Unmarshal(raw, &cfg.ValidAttachments); err != nil {
			return nil, invalidConfig("cni.dev/valid-attachments: %v", err)
		}
		for i, a := range cfg.ValidAttachments {
			if a.ContainerID == "" {
				return nil, invalidConfig("cni.dev/valid-attachments[%d]: containerID is missing", i)
			}
		}
	}
	return cfg, nil
}
