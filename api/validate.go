package api

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// The naming rules, written once: the masters, the agents' gossip and the
// IPAM service all check names with these.
//
// They are loops, not regular expressions: `[...]{0,254}` compiles to a
// program of hundreds of states, which every process paid for at start
// (carve-ipam, run twice per container, spent 1.6 ms and 6,800 allocations
// on it before doing anything).

// alnum tells whether c is an ASCII letter or digit.
func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }

// nameOf tells whether s is 1 to max bytes, the first a letter or digit and
// every other one a letter, a digit or one of extra.
func nameOf(s string, max int, extra string) bool {
	if s == "" || len(s) > max || !alnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !alnum(c) && strings.IndexByte(extra, c) < 0 {
			return false
		}
	}
	return true
}

func agentIDValid(id string) bool { return nameOf(id, 253, "._:@-") }

func containerIDValid(id string) bool { return nameOf(id, 255, "._:@/+=-") }

func overlayNameValid(name string) bool {
	if name == "" || len(name) > 13 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// reservedOverlayNames are Docker's and the CNI world's own network names.
var reservedOverlayNames = map[string]bool{"host": true, "bridge": true, "default": true, "none": true}

// ValidateAgentID checks an agent id: 1-253 characters of [A-Za-z0-9._:@-],
// starting with a letter or digit.
func ValidateAgentID(id string) error {
	if !agentIDValid(id) {
		return fmt.Errorf("agent id %q: want 1-253 characters of [A-Za-z0-9._:@-], starting with a letter or digit", id)
	}
	return nil
}

// ValidateOverlayName checks an overlay name: 1-13 characters of [a-z0-9-]
// (the bridge names m-<name> and d-<name> must fit IFNAMSIZ), not a name
// Docker or CNI reserve.
func ValidateOverlayName(name string) error {
	if !overlayNameValid(name) {
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
	if !containerIDValid(id) {
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
