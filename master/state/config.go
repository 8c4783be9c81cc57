package state

import (
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// The network configuration is package netconfig's: the table holds its
// parsed form (network) and consumes the overlays' definitions.
type (
	network    = netconfig.Network
	overlayDef = netconfig.Overlay
)

// Kept for the callers outside master/, cmd/ and test/ (the agent's
// tests) until they import netconfig; new code uses netconfig.
const (
	// DefaultVTEPName is netconfig.DefaultVTEPName.
	DefaultVTEPName = netconfig.DefaultVTEPName
	// DefaultVTEPPort is netconfig.DefaultVTEPPort.
	DefaultVTEPPort = netconfig.DefaultVTEPPort
)

// DefaultConfig is netconfig.Default.
func DefaultConfig() api.NetworkConfig { return netconfig.Default() }

// LoadConfig is netconfig.Load.
func LoadConfig(path string) (api.NetworkConfig, error) { return netconfig.Load(path) }
