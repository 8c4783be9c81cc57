package membership

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
)

// Message is a membership gossip message: a state and the
// masters' cluster its records come from. Records of another cluster (from
// before a rebuild of the masters) mean nothing in this one; the signatures
// cover the cluster id, so a record cannot be moved to another.
type Message struct {
	// ClusterID is the sender's cluster (api.State.ClusterID); empty when
	// the sender has not learnt one.
	ClusterID string `json:"cluster_id,omitempty"`
	// State is a delta: the records and tombstones that changed
	// (a broadcast, a relay), or those a peer lacks (an anti-entropy push).
	State
	// From is the sender of an anti-entropy digest, who is answered by
	// unicast.
	From string `json:"from,omitempty"`
	// AE is the anti-entropy part (see antientropy.go), under a key of
	// its own: an agent of the protocol before ignores it (and merges the
	// message's records and tombstones), and this one knows that
	// protocol's messages by their keys (Legacy).
	AE *AntiEntropy `json:"ae,omitempty"`
	// Legacy is set by Decode when the message carries anti-entropy of
	// the protocol before (digest, summary, want): that part is ignored,
	// its records and tombstones are not.
	Legacy bool `json:"-"`
}

// wireMessage is a message as decoded: with the keys of the anti-entropy
// protocol before, to know (and ignore) them.
type wireMessage struct {
	Message
	OldDigest  json.RawMessage `json:"digest,omitempty"`
	OldSummary json.RawMessage `json:"summary,omitempty"`
	OldWant    json.RawMessage `json:"want,omitempty"`
}

// MaxMessageBytes bounds a decoded membership message (mesh's own limit is 10 MiB).
const MaxMessageBytes = 8 << 20

// ErrBadGossip marks a membership message that cannot be decoded.
var ErrBadGossip = errors.New("bad membership message")

// Decode decodes and validates a membership message from the
// network, of at most MaxMessageBytes. Invalid records are an error for the
// whole message: a peer that sends garbage is broken, and merging half of
// it would hide that.
func Decode(data []byte) (Message, error) {
	if len(data) > MaxMessageBytes {
		return Message{}, fmt.Errorf("%w: %d bytes", ErrBadGossip, len(data))
	}
	return DecodeStored(data)
}

// DecodeStored decodes and validates a membership of any size, as the
// agent's own store holds it (as large as the cluster): Decode without its
// bound on a message from the network. Overlays are put in the order
// NewPeerRecord gives them (the signature does not depend on it).
func DecodeStored(data []byte) (Message, error) {
	var w wireMessage
	if err := json.Unmarshal(data, &w); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
	}
	msg := w.Message
	msg.Legacy = w.OldDigest != nil || w.OldSummary != nil || w.OldWant != nil
	for i := range msg.Records {
		if err := msg.Records[i].Validate(); err != nil {
			return Message{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
		}
		msg.Records[i].sortOverlays()
	}
	for _, t := range msg.Tombstones {
		if err := api.ValidateAgentID(t.AgentID); err != nil || t.Version == 0 || len(t.Signature) > 128 {
			return Message{}, fmt.Errorf("%w: tombstone %q at %d", ErrBadGossip, t.AgentID, t.Version)
		}
	}
	if err := validateAntiEntropy(&msg); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrBadGossip, err)
	}
	return msg, nil
}

// DeltaData is a delta (the records and tombstones that changed) of
// cluster clusterID as gossip data; sent, when set, counts the bytes of
// its encoding by kind.
func DeltaData(clusterID string, st State, sent func(kind string, n int)) gossip.Data {
	return membershipData{clusterID: clusterID, st: st, sent: sent}
}

// DigestData is agent from's anti-entropy digest (Membership.Digest) of
// cluster clusterID as gossip data, for periodic gossip; sent as in
// DeltaData.
func DigestData(clusterID, from string, digest uint64, sent func(kind string, n int)) gossip.Data {
	return membershipData{clusterID: clusterID, from: from, digest: &digest, sent: sent}
}

// membershipData is gossip data of one cluster: a delta (a State of what
// changed) and, for periodic gossip, a digest.
type membershipData struct {
	clusterID string
	st        State
	// from and digest: this agent's anti-entropy digest; nil for a delta alone.
	from   string
	digest *uint64
	// sent, when set, counts the bytes of every encoding (each is sent once).
	sent func(kind string, n int)
}

// Encode implements gossip.Data.
func (d membershipData) Encode() [][]byte {
	msg := Message{ClusterID: d.clusterID, State: d.st}
	if d.digest != nil {
		msg.From, msg.AE = d.from, &AntiEntropy{Digest: d.digest}
	}
	b := Encode(msg)
	if b == nil {
		return nil
	}
	if d.sent != nil {
		kind := "delta"
		if d.digest != nil {
			kind = "digest"
		}
		d.sent(kind, len(b))
	}
	return [][]byte{b}
}

// Merge implements gossip.Data: the join of both states. States of two
// clusters do not join: only this agent's queued sends are merged, and the
// later one (other) is of the cluster the agent is in now.
func (d membershipData) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(membershipData)
	if !ok {
		return d
	}
	if o.clusterID != d.clusterID {
		return o
	}
	out := o // the later digest, if any
	if out.digest == nil {
		out.from, out.digest = d.from, d.digest
	}
	if out.sent == nil {
		out.sent = d.sent
	}
	switch {
	case len(d.st.Records)+len(d.st.Tombstones) == 0:
	case len(o.st.Records)+len(o.st.Tombstones) == 0:
		out.st = d.st
	default:
		m := New()
		m.Merge(d.st)
		m.Merge(o.st)
		out.st = m.State()
	}
	return out
}
