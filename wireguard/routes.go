package wireguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// routeWant is one route the device's state wants: through the device to
// a peer, or unreachable.
type routeWant struct {
	dst         netip.Prefix
	unreachable bool
	src         netip.Addr // through the device only; invalid: none
}

// desiredRoutes are the routes of want, keyed by destination: one through
// the device for each allowed IP of every peer not rejected, and an
// unreachable one for each Unreachable prefix.
func desiredRoutes(want *Desired, rejected []string) map[netip.Prefix]routeWant {
	out := map[netip.Prefix]routeWant{}
	for _, p := range want.Unreachable {
		p = p.Masked()
		out[p] = routeWant{dst: p, unreachable: true}
	}
	for _, peer := range want.Peers {
		if slices.Contains(rejected, peer.ID) {
			continue
		}
		for _, p := range peer.AllowedIPs {
			p = p.Masked()
			src := want.Source
			if p.Addr().Is6() {
				src = want.Source6
			}
			out[p] = routeWant{dst: p, src: src}
		}
	}
	return out
}

// ApplyUnreachable is Apply for a host without a device (no key of its
// own): only the unreachable routes of want.Unreachable, and none of this
// package's other routes. Strict mode drops this way what it cannot encrypt.
func ApplyUnreachable(ctx context.Context, prefixes []netip.Prefix) (Report, error) {
	var rep Report
	nl, err := netlink.NewHandle()
	if err != nil {
		return rep, fmt.Errorf("wireguard: netlink: %w", err)
	}
	defer nl.Close()
	return rep, applyRoutes(ctx, nl, 0, &Desired{Unreachable: prefixes}, &rep)
}

// applyRoutes sets the routes want needs (through link) and removes the
// other routes of this package.
func applyRoutes(ctx context.Context, nl *netlink.Handle, link int, want *Desired, rep *Report) error {
	cur, err := ownRoutes(nl)
	if err != nil {
		return err
	}
	have := map[netip.Prefix]netlink.Route{}
	for _, r := range cur {
		if p, ok := routeDst(r); ok {
			have[p] = r
		}
	}
	var errs []error
	wantRoutes := desiredRoutes(want, rep.Rejected)
	for p, w := range wantRoutes {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r, ok := have[p]; ok && routeMatches(r, w, link) {
			continue
		}
		r := netlinkRoute(w, link)
		if err := nl.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("wireguard: route %s: %w", p, err))
			continue
		}
		rep.RoutesSet++
	}
	for p, r := range have {
		if _, ok := wantRoutes[p]; ok {
			continue
		}
		if err := nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("wireguard: delete route %s: %w", p, err))
			continue
		}
		rep.RoutesRemoved++
	}
	return errors.Join(errs...)
}

// ownRoutes lists the main table's routes marked with Protocol.
func ownRoutes(nl *netlink.Handle) ([]netlink.Route, error) {
	routes, err := nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("wireguard: list routes: %w", err)
	}
	return routes, nil
}

func routeDst(r netlink.Route) (netip.Prefix, bool) {
	if r.Dst == nil {
		return netip.Prefix{}, false
	}
	return prefixOf(*r.Dst)
}

func routeMatches(r netlink.Route, w routeWant, link int) bool {
	if r.Priority != RouteMetric {
		return false
	}
	if w.unreachable {
		return r.Type == unix.RTN_UNREACHABLE
	}
	src, _ := netip.AddrFromSlice(r.Src)
	return r.Type == unix.RTN_UNICAST && r.LinkIndex == link && src.Unmap() == w.src
}

func netlinkRoute(w routeWant, link int) netlink.Route {
	dst := ipNets([]netip.Prefix{w.dst})[0]
	r := netlink.Route{Dst: &dst, Protocol: Protocol, Priority: RouteMetric, Table: unix.RT_TABLE_MAIN}
	if w.unreachable {
		r.Type = unix.RTN_UNREACHABLE
		return r
	}
	r.Type = unix.RTN_UNICAST
	r.LinkIndex = link
	r.Scope = netlink.SCOPE_LINK
	if w.src.IsValid() {
		r.Src = net.IP(w.src.AsSlice())
	}
	return r
}
