package netconfig

import (
	"slices"

	"github.com/carve-net/carve/api"
)

// validateEncryption checks the network's encryption fields: a known mode,
// and a WireGuard port that is not the VXLAN port (both are UDP sockets of
// every agent).
func validateEncryption(cfg api.NetworkConfig) error {
	if !slices.Contains(api.EncryptionModes, cfg.Encryption) {
		return configErr("encryption", "%q: want %q, %q, or absent (off)", cfg.Encryption, api.EncryptionWireGuard, api.EncryptionWireGuardStrict)
	}
	if port := api.WireGuardPortOf(&cfg); port == cfg.VTEPPort {
		return configErr("wireguard_port", "%d is vtep_port too: the WireGuard and VXLAN sockets need ports of their own", port)
	}
	return nil
}
