// Package ipamvalidate checks what the IPAM's callers ask (an attachment
// request, a collection request) before anything is decided: each error
// names the bad field and what it wants, and a request that passes has its
// default bridge filled in. Pure: it imports nothing of ours but api and
// ipfamily.
package ipamvalidate

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
)

// Request checks an attachment request, names the bad field, and
// fills in the default bridge.
func Request(req *api.IPAMRequest) error {
	if err := network(req.Network); err != nil {
		return err
	}
	if err := api.ValidateContainerID(req.ContainerID); err != nil {
		return fmt.Errorf("container_id: %w", err)
	}
	if err := api.ValidateIfName(req.IfName); err != nil {
		return fmt.Errorf("ifname: %w", err)
	}
	switch req.Bridge {
	case "":
		req.Bridge = api.BridgeMesos
	case api.BridgeMesos, api.BridgeDocker:
	default:
		return fmt.Errorf("bridge %q: want %q or %q", req.Bridge, api.BridgeMesos, api.BridgeDocker)
	}
	if req.Address != "" {
		if a, err := netip.ParseAddr(req.Address); err != nil || a.Zone() != "" {
			return fmt.Errorf("address %q is not an IP address", req.Address)
		}
	}
	if _, err := RequestedAddrs(*req); err != nil {
		return err
	}
	if err := req.Owner.Validate(); err != nil {
		return err
	}
	if req.Family != "" && req.Family != "4" && req.Family != "6" {
		return fmt.Errorf("family %q: want 4, 6 or empty", req.Family)
	}
	return nil
}

// GC checks a collection request and names the bad field.
func GC(req api.GCRequest) error {
	if err := network(req.Network); err != nil {
		return err
	}
	if req.Bridge != "" && req.Bridge != api.BridgeMesos && req.Bridge != api.BridgeDocker {
		return fmt.Errorf("bridge %q: want %q, %q or empty", req.Bridge, api.BridgeMesos, api.BridgeDocker)
	}
	for i, k := range req.Keep {
		if err := api.ValidateContainerID(k.ContainerID); err != nil {
			return fmt.Errorf("keep[%d].container_id: %w", i, err)
		}
		if k.IfName != "" {
			if err := api.ValidateIfName(k.IfName); err != nil {
				return fmt.Errorf("keep[%d].ifname: %w", i, err)
			}
		}
	}
	return nil
}

func network(name string) error {
	if name == "" {
		return errors.New("network is required (the overlay name)")
	}
	if err := api.ValidateOverlayName(name); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// RequestedAddrs returns the request's requested addresses (Address and
// Addresses) by family (invalid where none is requested).
func RequestedAddrs(req api.IPAMRequest) ([ipfamily.Count]netip.Addr, error) {
	var out [ipfamily.Count]netip.Addr
	list := req.Addresses
	if req.Address != "" {
		list = append([]string{req.Address}, list...)
	}
	addrs, err := api.ParseRequestedIPs(list)
	if err != nil {
		return out, fmt.Errorf("addresses: %w", err)
	}
	for _, a := range addrs {
		out[ipfamily.Of(a)] = a
	}
	return out, nil
}
