package dockeripam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/carve-net/carve/api"
)

// Docker network options carve sets (moby's netlabel and bridge driver).
const (
	optBridgeName = "com.docker.network.bridge.name"
	optMasquerade = "com.docker.network.bridge.enable_ip_masquerade"
	optMTU        = "com.docker.network.driver.mtu"
	// LabelOverlay marks the Docker networks carve created.
	LabelOverlay = "net.carve.overlay"
)

// DefaultNetworkName is the default template of an overlay's Docker
// network name: the overlay's own name, as DC/OS names it, since that is
// what its Docker containerizer passes to --net.
const DefaultNetworkName = OverlayPlaceholder

// OverlayPlaceholder is replaced by the overlay's name in a network name
// template (Options.NetworkName).
const OverlayPlaceholder = "{overlay}"

// BridgeName is the Linux bridge of an overlay's Docker network, d-<overlay>
// (DC/OS's docker_bridge), whatever the network is named.
func BridgeName(overlay string) string { return "d-" + overlay }

// LegacyNetworkName is the name carve gave an overlay's Docker network
// before the name followed DC/OS: the bridge's. Such a network is migrated
// (see Service.ensureOne).
func LegacyNetworkName(overlay string) string { return BridgeName(overlay) }

// NetworkName renders a network name template for an overlay.
func NetworkName(template, overlay string) string {
	return strings.ReplaceAll(template, OverlayPlaceholder, overlay)
}

// ValidateNetworkName checks a network name template: it must name each
// overlay apart (contain OverlayPlaceholder) and give names Docker accepts
// ([a-zA-Z0-9][a-zA-Z0-9_.-]*, at most 64 characters with the longest
// overlay name).
func ValidateNetworkName(template string) error {
	if !strings.Contains(template, OverlayPlaceholder) {
		return fmt.Errorf("docker network name %q: want a template containing %s (each overlay needs a network of its own)", template, OverlayPlaceholder)
	}
	name := NetworkName(template, "abcdefghij-13")
	if len(name) > 64 {
		return fmt.Errorf("docker network name %q: %q is longer than 64 characters", template, name)
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || i > 0 && (r == '_' || r == '.' || r == '-')
		if !ok {
			return fmt.Errorf("docker network name %q: %q is not a Docker network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)", template, name)
		}
	}
	return nil
}

// desiredNetwork is the Docker network carve wants for an overlay.
func (s *Service) desiredNetwork(overlay string) (dockerNetwork, bool) {
	v4, v6, ok := s.driver.svc.BridgeSubnets(overlay, api.BridgeDocker)
	if !ok || (!v4.IsValid() && !v6.IsValid()) {
		return dockerNetwork{}, false
	}
	mtu := 0
	if s.opts.MTU != nil {
		mtu = s.opts.MTU(overlay)
	}
	if mtu <= 0 {
		mtu = DefaultMTU
	}
	n := dockerNetwork{Name: NetworkName(s.opts.NetworkName, overlay), Driver: "bridge", EnableIPv6: v6.IsValid()}
	n.IPAM.Driver = s.name
	n.IPAM.Options = map[string]string{OptionNetwork: overlay}
	for _, p := range []poolID{{prefix: v4}, {prefix: v6, v6: true}} {
		if p.prefix.IsValid() {
			p.prefix = p.prefix.Masked()
			n.IPAM.Config = append(n.IPAM.Config, ipamConfig{Subnet: p.prefix.String(), Gateway: p.gateway().String()})
		}
	}
	n.Options = map[string]string{
		optBridgeName: BridgeName(overlay),
		optMasquerade: "false",
		optMTU:        strconv.Itoa(mtu),
	}
	n.Labels = map[string]string{LabelOverlay: overlay}
	return n, true
}

// differences lists how an existing network differs from the desired one.
func differences(have *dockerNetwork, want dockerNetwork) []string {
	var out []string
	diff := func(what, h, w string) {
		if h != w {
			if h == "" {
				h = "unset"
			}
			out = append(out, fmt.Sprintf("%s is %s (want %s)", what, h, w))
		}
	}
	diff("driver", have.Driver, want.Driver)
	diff("IPAM driver", have.IPAM.Driver, want.IPAM.Driver)
	diff("IPAM option "+OptionNetwork, have.IPAM.Options[OptionNetwork], want.IPAM.Options[OptionNetwork])
	subnets := func(cs []ipamConfig) string {
		var ss []string
		for _, c := range cs {
			s := c.Subnet
			if c.Gateway != "" {
				s += " gateway " + c.Gateway
			}
			if c.IPRange != "" {
				s += " range " + c.IPRange
			}
			ss = append(ss, s)
		}
		slices.Sort(ss)
		return strings.Join(ss, ", ")
	}
	diff("subnets", subnets(have.IPAM.Config), subnets(want.IPAM.Config))
	diff("IPv6", strconv.FormatBool(have.EnableIPv6), strconv.FormatBool(want.EnableIPv6))
	for _, k := range []string{optBridgeName, optMTU, optMasquerade} {
		diff("option "+k, have.Options[k], want.Options[k])
	}
	return out
}

// ensureAll checks (and creates) the network of every overlay.
func (s *Service) ensureAll(ctx context.Context, c *engineClient) { s.ensure(ctx, c, false) }

// ensureNew checks only overlays that are new, changed or not yet OK.
func (s *Service) ensureNew(ctx context.Context, c *engineClient) { s.ensure(ctx, c, true) }

func (s *Service) ensure(ctx context.Context, c *engineClient, onlyNew bool) {
	prev := map[string]NetworkStatus{}
	s.mu.Lock()
	for _, n := range s.status.Networks {
		prev[n.Overlay] = n
	}
	s.mu.Unlock()
	var out []NetworkStatus
	for _, ov := range s.driver.svc.Networks() {
		want, ok := s.desiredNetwork(ov)
		if !ok {
			continue
		}
		spec, _ := json.Marshal(want)
		s.mu.Lock()
		same := s.ensured[ov] == string(spec)
		s.mu.Unlock()
		if p, seen := prev[ov]; onlyNew && seen && p.State == NetworkOK && same {
			out = append(out, p)
			continue
		}
		st := s.ensureOne(ctx, c, ov, want)
		s.mu.Lock()
		if st.State == NetworkOK {
			s.ensured[ov] = string(spec)
		} else {
			delete(s.ensured, ov)
		}
		s.mu.Unlock()
		out = append(out, st)
	}
	s.mu.Lock()
	s.status.Networks = out
	s.mu.Unlock()
}

func (s *Service) ensureOne(ctx context.Context, c *engineClient, overlay string, want dockerNetwork) NetworkStatus {
	st := NetworkStatus{Overlay: overlay, Name: want.Name}
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	have, err := c.inspectNetwork(cctx, want.Name)
	if errors.Is(err, errNotFound) {
		if legacy, ok := s.migrateLegacy(cctx, c, overlay, want); !ok {
			return legacy
		}
		id, cerr := c.createNetwork(cctx, want)
		if cerr == nil {
			s.log.Info("created docker network", "network", want.Name, "id", id, "subnets", want.IPAM.Config, "driver", s.name)
			st.ID, st.State = id, NetworkOK
			s.note("net/"+overlay, slog.LevelDebug, "docker network ok", "network", want.Name)
			return st
		}
		var ae *api.Error
		if !errors.As(cerr, &ae) || ae.Status != http.StatusConflict {
			st.State, st.Error = NetworkError, fmt.Sprintf("create Docker network %s: %v", want.Name, cerr)
			s.note("net/"+overlay, slog.LevelError, "docker network not created", "network", want.Name, "err", cerr)
			return st
		}
		// Created meanwhile by someone else: look at it.
		have, err = c.inspectNetwork(cctx, want.Name)
	}
	if err != nil {
		st.State, st.Error = NetworkError, fmt.Sprintf("inspect Docker network %s: %v", want.Name, err)
		s.note("net/"+overlay, slog.LevelError, "docker network not inspected", "network", want.Name, "err", err)
		return st
	}
	st.ID = have.ID
	if diffs := differences(have, want); have.Name == want.Name && len(diffs) > 0 {
		st.State = NetworkMismatch
		st.Error = fmt.Sprintf("Docker network %s exists with other settings: %s; carve leaves it alone (remove it with `docker network rm %s` and carve recreates it)",
			want.Name, strings.Join(diffs, "; "), want.Name)
		s.note("net/"+overlay, slog.LevelWarn, st.Error, "network", want.Name)
		return st
	}
	if have.Name != want.Name {
		st.State, st.Error = NetworkError, fmt.Sprintf("Docker resolved %s to network %q", want.Name, have.Name)
		return st
	}
	st.State = NetworkOK
	s.note("net/"+overlay, slog.LevelDebug, "docker network ok", "network", want.Name)
	return st
}

// migrateLegacy handles the network an older carve created for the overlay
// under its legacy name d-<overlay>, when the configured name is another
// and no network of that name exists yet: both cannot exist, since they
// would share the bridge. The legacy network is removed when no container
// uses it (Docker refuses to remove a network with endpoints, so a
// container attaching meanwhile is safe), and the caller creates the new
// one. While containers use it, it stays and keeps working (its IPAM
// driver is this plugin, so the leak collector covers it) and the status
// says so; every pass tries again. A network of that name that carve did
// not create is not touched. It returns false with the status to report
// when the caller must not create the new network now.
func (s *Service) migrateLegacy(ctx context.Context, c *engineClient, overlay string, want dockerNetwork) (NetworkStatus, bool) {
	name := LegacyNetworkName(overlay)
	if want.Name == name {
		return NetworkStatus{}, true
	}
	old, err := c.inspectNetwork(ctx, name)
	if errors.Is(err, errNotFound) {
		return NetworkStatus{}, true
	}
	st := NetworkStatus{Overlay: overlay, Name: want.Name}
	if err != nil {
		st.State, st.Error = NetworkError, fmt.Sprintf("inspect Docker network %s (the legacy name): %v", name, err)
		return st, false
	}
	if old.Labels[LabelOverlay] != overlay || old.IPAM.Driver != s.name {
		return NetworkStatus{}, true // not carve's: creating ours reports any conflict
	}
	if len(old.Containers) == 0 {
		if err := c.removeNetwork(ctx, old.ID); err != nil && !errors.Is(err, errNotFound) {
			st.State, st.Error = NetworkLegacy, fmt.Sprintf("Docker network %s of an older carve could not be removed (%v); %s is created once it is gone", name, err, want.Name)
			s.note("net/"+overlay, slog.LevelWarn, st.Error, "network", name)
			return st, false
		}
		s.log.Info("removed the Docker network of an older carve, unused; creating it under its new name", "old", name, "new", want.Name, "overlay", overlay)
		return NetworkStatus{}, true
	}
	st.ID, st.State = old.ID, NetworkLegacy
	st.Error = fmt.Sprintf("Docker network %s of an older carve still has %d containers: it keeps working, and carve replaces it by %s once they are gone", name, len(old.Containers), want.Name)
	s.note("net/"+overlay, slog.LevelWarn, st.Error, "network", name)
	return st, false
}
