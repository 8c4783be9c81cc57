package api

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxCNIArgs bounds CNI_ARGS (remote input: the runtime's environment).
const maxCNIArgs = 4096

// ErrBadCNIArgs marks a CNI_ARGS that is not ";"-separated KEY=VALUE pairs
// of printable text, or whose IP= is not a list of addresses.
var ErrBadCNIArgs = errors.New("invalid CNI_ARGS")

// CNIArgs is what carve reads of CNI_ARGS.
type CNIArgs struct {
	// Owner holds the identity keys carve records (K8S_POD_*, NOMAD_*);
	// every other key is ignored, whatever IgnoreUnknown says.
	Owner Owner
	// IPs are the addresses of IP= (comma-separated, with or without a
	// prefix length, as host-local takes them): Podman's and nerdctl's --ip.
	IPs []netip.Addr
}

// ParseCNIArgs reads CNI_ARGS: KEY=VALUE pairs separated by ";" in any
// order (empty pairs are skipped). Errors wrap ErrBadCNIArgs and name the
// pair at fault.
func ParseCNIArgs(s string) (CNIArgs, error) {
	var out CNIArgs
	if len(s) > maxCNIArgs {
		return out, fmt.Errorf("%w: %d bytes, at most %d", ErrBadCNIArgs, len(s), maxCNIArgs)
	}
	known := out.Owner.cniArgsFields()
	seen := map[string]bool{}
	for i, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return CNIArgs{}, fmt.Errorf("%w: pair %d %q: want KEY=VALUE", ErrBadCNIArgs, i+1, clip(pair))
		}
		if err := checkPrintable(pair, maxOwnerField); err != nil {
			return CNIArgs{}, fmt.Errorf("%w: %s: %v", ErrBadCNIArgs, clip(k), err)
		}
		if seen[k] {
			return CNIArgs{}, fmt.Errorf("%w: %s is given twice", ErrBadCNIArgs, k)
		}
		seen[k] = true
		if f, ok := known[k]; ok {
			*f = v
			continue
		}
		if k == "IP" {
			ips, err := ParseRequestedIPs(strings.Split(v, ","))
			if err != nil {
				return CNIArgs{}, fmt.Errorf("%w: IP=%s: %v", ErrBadCNIArgs, v, err)
			}
			out.IPs = ips
		}
	}
	return out, nil
}

// ParseRequestedIPs reads requested addresses, each with or without a
// prefix length (the prefix is the runtime's idea of the subnet: the agent
// answers with its bridge's), at most one per address family.
func ParseRequestedIPs(list []string) ([]netip.Addr, error) {
	var out []netip.Addr
	var fams [2]bool
	for _, s := range list {
		a, err := ParseHostAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		fam := 0
		if a.Is6() {
			fam = 1
		}
		if fams[fam] {
			return nil, fmt.Errorf("two IPv%d addresses (%s): carve gives one address per family", 4+2*fam, strings.Join(list, ","))
		}
		fams[fam] = true
		out = append(out, a)
	}
	return out, nil
}

// ParseHostAddr reads an address with or without a prefix length ("10.0.0.5",
// "10.0.0.5/24"); zones are refused.
func ParseHostAddr(s string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Unmap(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address (want 10.0.0.5 or 10.0.0.5/24)", clip(s))
	}
	return a.Unmap(), nil
}

// clip shortens remote text quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
