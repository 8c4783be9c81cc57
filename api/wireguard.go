package api

import (
	"context"
	"net/http"
)

// The values of NetworkConfig.Encryption.
const (
	// EncryptionWireGuard routes the traffic to every peer whose signed
	// record carries a WireGuard key through WireGuard, and keeps VXLAN in
	// the clear to peers without one (a rolling enable).
	EncryptionWireGuard = "wireguard"
	// EncryptionWireGuardStrict is EncryptionWireGuard that never sends in
	// the clear: a peer without a key is unreachable (dropped, not leaked).
	EncryptionWireGuardStrict = "wireguard-strict"
	// DefaultWireGuardPort is the UDP port of the agents' WireGuard
	// devices when NetworkConfig.WireGuardPort is 0 (WireGuard's own).
	DefaultWireGuardPort = 51820
)

// EncryptionModes lists NetworkConfig.Encryption's valid values ("": off).
var EncryptionModes = []string{"", EncryptionWireGuard, EncryptionWireGuardStrict}

// WireGuardPortOf is the WireGuard port of a network configuration.
func WireGuardPortOf(n *NetworkConfig) uint16 {
	if n == nil || n.WireGuardPort == 0 {
		return DefaultWireGuardPort
	}
	return n.WireGuardPort
}

// The states of a peer in WireGuardStatus and in the agent's
// carve_wireguard_peers metric.
const (
	// PeerKeyed: reached through WireGuard.
	PeerKeyed = "keyed"
	// PeerCleartext: no key in its record, reached over VXLAN in the clear
	// (encryption "wireguard" only).
	PeerCleartext = "cleartext"
	// PeerDropped: no key in its record, unreachable (encryption
	// "wireguard-strict").
	PeerDropped = "dropped"
)

// WireGuardStatus is GET /overlay-agent/wireguard (and the answer of POST
// /overlay-agent/wireguard/rotate): this agent's encryption as it runs.
type WireGuardStatus struct {
	// Mode is the network's encryption ("" when off).
	Mode string `json:"mode"`
	// PublicKey is the key this agent holds (base64); RegisteredKey the one
	// in its signed record. They differ only while a registration is due.
	PublicKey     string `json:"public_key,omitempty"`
	RegisteredKey string `json:"registered_key,omitempty"`
	// Device is the WireGuard interface's name and Implementation "kernel"
	// or "userspace" (empty while encryption is off).
	Device         string `json:"device,omitempty"`
	Implementation string `json:"implementation,omitempty"`
	// Peers counts the peers by state (PeerKeyed, PeerCleartext, PeerDropped).
	Peers map[string]int `json:"peers,omitempty"`
	// Cleartext names the peers reached in the clear or dropped for want of a key.
	Cleartext []string `json:"cleartext,omitempty"`
	// Rotations counts the key rotations since the agent started.
	Rotations int `json:"rotations"`
	// Error is the last failure to configure the device, if any.
	Error string `json:"error,omitempty"`
}

// WireGuard returns the agent's encryption status.
func (c *AgentClient) WireGuard(ctx context.Context) (*WireGuardStatus, error) {
	var out WireGuardStatus
	return &out, c.get(ctx, "/overlay-agent/wireguard", &out)
}

// RotateWireGuardKey has the agent make a new WireGuard key pair and
// register its public key; it answers once the masters signed it.
func (c *AgentClient) RotateWireGuardKey(ctx context.Context) (*WireGuardStatus, error) {
	var out WireGuardStatus
	return &out, Call(ctx, c.http, http.MethodPost, c.base+"/overlay-agent/wireguard/rotate", struct{}{}, &out, nil)
}
