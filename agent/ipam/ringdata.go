package ipam

// Ring messages as gossip data: the mesh's side of the ring channel. The
// messages themselves, their bytes and their checks are package ipamwire's.

import (
	"errors"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/gossip"
)

// errOtherCluster marks a ring or space message of another masters'
// cluster: its leases carry Raft indexes of another log and are refused
// whole.
var errOtherCluster = errors.New("ring message of another cluster")

// ringData is a ring message as gossip data.
type ringData struct {
	msg ipamwire.RingMessage
	// sent, when set, counts the bytes of every encoding.
	sent func(kind string, n int)
}

// Encode implements gossip.Data.
func (d ringData) Encode() [][]byte {
	b := ipamwire.EncodeRingMessage(d.msg)
	if d.sent != nil {
		d.sent(d.msg.Kind(), len(b))
	}
	return [][]byte{b}
}

// Merge implements gossip.Data as a join (ipamwire.JoinRingMessages): mesh
// merges pending data (d) with new data (other).
func (d ringData) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(ringData)
	if !ok {
		return d
	}
	sent := o.sent
	if sent == nil {
		sent = d.sent
	}
	return ringData{msg: ipamwire.JoinRingMessages(d.msg, o.msg), sent: sent}
}
