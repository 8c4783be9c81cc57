package api

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
)

// The naming rules, written once: the masters, the agents' gossip and the
// IPAM service all check names with these.
var (
	agentIDPattern     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$`)
	overlayNamePattern = regexp.MustCompile(`^[a-z0-9-]{1,13}$`)
	containerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,254}$`)
)

// reservedOverlayNames are Docker's and the CNI world's own network names.
var reservedOverlayNames = map[string]bool{"host": true, "bridge": true, "default": true, "none": true}

// ValidateAgentID checks an agent id: 1-253 characters of [A-Za-z0-9._:@-],
// starting with a letter or digit.
func ValidateAgentID(id string) error {
	if !agentIDPattern.MatchString(id) {
		return fmt.Errorf("agent id %q: want 1-253 characters of [A-Za-z0-9._:@-], starting with a letter or digit", id)
	}
	return nil
}

// ValidateOverlayName checks an overlay name: 1-13 characters of [a-z0-9-]
// (the bridge names m-<name> and d-<name> must fit IFNAMSIZ), not a name
// Docker or CNI reserve.
func ValidateOverlayName(name string) error {
	if !overlayNamePattern.MatchString(name) {
		return fmt.Errorf("overlay name %q: want 1-13 characters of [a-z0-9-]", name)
	}
	if reservedOverlayNames[name] {
		return fmt.Errorf("overlay name %q is reserved", name)
	}
	return nil
}

// ValidateIfName checks a Linux interface name: 1-15 printable ASCII
// characters without '/', ':' or spaces, and not "." or "..".
func ValidateIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." || strings.IndexFunc(name, badIfNameRune) >= 0 {
		return fmt.Errorf("interface name %q: want 1-15 printable characters without '/', ':' or spaces", name)
	}
	return nil
}

func badIfNameRune(r rune) bool { return r <= ' ' || r == '/' || r == ':' || r > '~' }

// ValidateContainerID checks a container id: 1-255 printable characters of
// [A-Za-z0-9._:@/+=-], starting with a letter or digit.
func ValidateContainerID(id string) error {
	if !containerIDPattern.MatchString(id) {
		return fmt.Errorf("container id %q: want 1-255 characters of [A-Za-z0-9._:@/+=-], starting with a letter or digit", id)
	}
	return nil
}

// The bounds of an underlay MTU an agent may register: IPv4's minimum
// datagram every host must accept, and the largest IP packet.
const (
	MinUnderlayMTU = 576
	MaxUnderlayMTU = 65535
)

// Validate checks the keys' syntax: each empty or standard base64 of 32
// bytes.
func (k AgentKeys) Validate() error {
	for _, f := range []struct{ name, value string }{{"keys.claim", k.Claim}, {"keys.wireguard", k.WireGuard}} {
		if f.value == "" {
			continue
		}
		if b, err := base64.StdEncoding.DecodeString(f.value); err != nil || len(b) != 32 {
			return fmt.Errorf("%s: want standard base64 of a 32-byte public key", f.name)
		}
	}
	return nil
}

// ValidateUnderlayMTU checks a registered underlay MTU (0: none reported).
func ValidateUnderlayMTU(mtu int) error {
	if mtu != 0 && (mtu < MinUnderlayMTU || mtu > MaxUnderlayMTU) {
		return fmt.Errorf("underlay_mtu %d: want 0 (not reported) or %d-%d", mtu, MinUnderlayMTU, MaxUnderlayMTU)
	}
	return nil
}
