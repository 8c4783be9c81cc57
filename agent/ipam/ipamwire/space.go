package ipamwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/carve-net/carve/api"
)

// Space requests and answers travel as unicasts on the ring channel: small
// versioned JSON objects, strictly decoded. The receiver checks the rest:
// the sender's id must be the peer the gossip router delivered the message
// from, the cluster id the receiver's, and an answer must match a request
// in flight to that peer.

// SpaceVersion is the version of the space messages this agent speaks.
const SpaceVersion = 1

// Kinds of space messages.
const (
	KindRequest = "request"
	KindGrant   = "grant"
	KindRefuse  = "refuse"
)

// Reasons of a refusal that an asker tells apart (any other printable
// reason may come too, and is shown as it is).
const (
	// ReasonIPv6NotGranted refuses a request for IPv6 space: a donor
	// grants out of its bridges' first blocks, which are on-link for its
	// own containers. IPv4 has the bridge answer ARP for the granted part
	// (proxy_arp); IPv6 would need a proxy NDP entry per address the
	// recipient hands out, so IPv6 grows at the masters only.
	ReasonIPv6NotGranted = "ipv6_not_granted"
	// ReasonRecipientQuota refuses a request from an agent that holds, as
	// the donor's ring sees it, its quota of grown and granted space
	// (quota_prefix) or would with any block the donor could give.
	ReasonRecipientQuota = "recipient_quota"
	// ReasonNoSpace refuses a request the donor has no block to spare for
	// (it keeps at least as much as it gives).
	ReasonNoSpace = "no_space"
)

// SpaceMessage is a space request, or its answer.
type SpaceMessage struct {
	V         int    `json:"v"`
	Kind      string `json:"kind"`
	ClusterID string `json:"cluster_id"`
	From      string `json:"from"`
	ID        string `json:"id"`
	Overlay   string `json:"overlay"`
	Family    string `json:"family"`
	// Bits is the prefix length of the block a request asks for.
	Bits int `json:"bits,omitempty"`
	// Prefix is the block a grant gives, Ring the donor's ring after it
	// (or what the grant wrote in it).
	Prefix string `json:"prefix,omitempty"`
	Ring   []byte `json:"ring,omitempty"`
	// Reason says why a refusal refused.
	Reason string `json:"reason,omitempty"`
	// Expires and GrantSig are a grant's signed statement (GrantStatement),
	// which the recipient reports to the masters with the grant.
	Expires  int64  `json:"expires,omitempty"`
	GrantSig string `json:"grant_sig,omitempty"`
	// Sig is a request's signature by its sender's claim key
	// (SpaceRequestSigningBytes): a donor grants only to the agent that
	// asked.
	Sig string `json:"sig,omitempty"`
}

// EncodeSpaceMessage is a space message's wire bytes.
func EncodeSpaceMessage(m SpaceMessage) []byte {
	b, _ := json.Marshal(m) // strings, numbers and bytes: cannot fail
	return b
}

// DecodeSpaceMessage decodes and checks a space message from the network:
// strict JSON (no unknown field, nothing after it), this version, the
// fields of its kind and no other, each within its bounds. The error
// wraps ErrBadSpaceMessage.
func DecodeSpaceMessage(b []byte) (SpaceMessage, error) {
	var m SpaceMessage
	if len(b) > MaxMessageBytes {
		return m, fmt.Errorf("%w: %d bytes", ErrBadSpaceMessage, len(b))
	}
	if err := api.DecodeStrict(bytes.NewReader(b), &m); err != nil {
		return SpaceMessage{}, fmt.Errorf("%w: %v", ErrBadSpaceMessage, err)
	}
	if err := m.check(len(b)); err != nil {
		return SpaceMessage{}, fmt.Errorf("%w: %v", ErrBadSpaceMessage, err)
	}
	return m, nil
}

// GrantedPrefix is the block a decoded grant gives (checked when decoded;
// invalid for any other message).
func (m SpaceMessage) GrantedPrefix() netip.Prefix {
	if m.Kind != KindGrant {
		return netip.Prefix{}
	}
	p, _ := netip.ParsePrefix(m.Prefix)
	return p
}

func (m *SpaceMessage) check(size int) error {
	if m.V != SpaceVersion {
		return fmt.Errorf("version %d (this agent speaks %d)", m.V, SpaceVersion)
	}
	if len(m.ClusterID) > MaxClusterIDLen {
		return fmt.Errorf("cluster id of %d bytes", len(m.ClusterID))
	}
	if err := api.ValidateAgentID(m.From); err != nil {
		return fmt.Errorf("from: %v", err)
	}
	if m.ID == "" || len(m.ID) > MaxRequestIDLen || !printable(m.ID) {
		return fmt.Errorf("request id %q", m.ID)
	}
	if err := api.ValidateOverlayName(m.Overlay); err != nil {
		return err
	}
	if len(m.Sig) > MaxSigLen {
		return fmt.Errorf("signature of %d bytes", len(m.Sig))
	}
	width := 32
	switch m.Family {
	case "4":
	case "6":
		width = 128
	default:
		return fmt.Errorf("family %q", m.Family)
	}
	switch m.Kind {
	case KindRequest:
		if size > MaxSpaceRequestBytes {
			return fmt.Errorf("request of %d bytes", size)
		}
		if m.Bits < 1 || m.Bits > width || m.Prefix != "" || m.Ring != nil || m.Reason != "" || m.Expires != 0 || m.GrantSig != "" {
			return fmt.Errorf("request of a /%d block, or with answer fields", m.Bits)
		}
	case KindGrant:
		p, err := netip.ParsePrefix(m.Prefix)
		if err != nil || p.Masked() != p || p.Addr().BitLen() != width || p.Addr().Zone() != "" {
			return fmt.Errorf("granted prefix %q", m.Prefix)
		}
		if len(m.Ring) == 0 || m.Bits != 0 || m.Reason != "" || m.Sig != "" || m.Expires < 0 || len(m.GrantSig) > MaxSigLen {
			return errors.New("grant without a ring, or with other fields")
		}
	case KindRefuse:
		if len(m.Reason) > MaxReasonLen || !printable(m.Reason) || m.Bits != 0 || m.Prefix != "" || m.Ring != nil || m.Expires != 0 || m.GrantSig != "" || m.Sig != "" {
			return errors.New("refusal with a bad reason, or with other fields")
		}
	default:
		return fmt.Errorf("kind %q", m.Kind)
	}
	return nil
}
