// Package gossip gives a process named gossip channels over one
// github.com/weaveworks/mesh router, behind small interfaces, so that
// several users (agent records, one ring per overlay) share one router and
// tests can swap mesh for the in-process fake in package fakegossip (mesh has
// data races the race detector reports when real routers talk over TCP).
//
// A channel carries three kinds of traffic, as mesh does:
//   - broadcast: a state pushed to every peer along a spanning tree, for
//     local changes;
//   - gossip: what Handler.Gossip returns, sent periodically (by the router)
//     to a few random neighbours and to every new neighbour, and relayed
//     while it carries news, so that peers converge even when broadcasts
//     are lost. It may be the complete state, or (as carve's channels do) a
//     digest that receivers answer by unicast with what differs;
//   - unicast: an opaque message to one named peer (requests and answers).
//
// Peers are named by their agent id everywhere in this package.
package gossip

import "errors"

// Data is a piece of state that a channel gossips. Pending sends to the same
// neighbour are coalesced with Merge, so Merge must be a join: the result
// must carry everything both carried.
type Data interface {
	// Encode returns the messages that carry the data (usually one).
	Encode() [][]byte
	// Merge returns data carrying both d and other; it may modify neither.
	Merge(other Data) Data
}

// Handler receives what arrives on a channel. Its methods are called
// concurrently, from the router's goroutines. An error is logged by the
// router and goes no further: a peer that sends something bad must not
// bring the connection down.
type Handler interface {
	// Gossip returns what to gossip periodically: the complete local
	// state, or a digest of it that OnGossip answers by unicast (so that a
	// round costs the difference, not the state); nil when there is
	// nothing to say.
	Gossip() Data
	// OnGossip merges a received state and returns what in it was news
	// to this peer (to be relayed), or nil.
	OnGossip(msg []byte) (Data, error)
	// OnBroadcast merges a broadcast from src and returns the data to
	// relay further along the broadcast tree (usually the merged state),
	// or nil to stop it here.
	OnBroadcast(src string, msg []byte) (Data, error)
	// OnUnicast handles a message addressed to this peer.
	OnUnicast(src string, msg []byte) error
}

// Channel is the sending side of a named channel.
type Channel interface {
	// Broadcast sends data to every peer.
	Broadcast(d Data)
	// Gossip sends data to a few random neighbours, who relay what is new.
	Gossip(d Data)
	// Unicast sends msg to peer dst. Delivery is not guaranteed: callers
	// that need an answer retry.
	Unicast(dst string, msg []byte) error
}

// Router is one process's membership in the gossip network.
type Router interface {
	// Self is this peer's id.
	Self() string
	// Channel registers handler h for the channel called name and returns
	// the channel to send on. With mesh, channels must be registered
	// before the router starts.
	Channel(name string, h Handler) (Channel, error)
	// Peers returns the ids of the other peers this router knows, sorted.
	Peers() []string
}

// Errors callers branch on.
var (
	// ErrStarted marks a channel registered after the router started.
	ErrStarted = errors.New("gossip: router already started")
	// ErrDuplicateChannel marks a second registration of a channel name.
	ErrDuplicateChannel = errors.New("gossip: channel already registered")
	// ErrUnknownPeer marks a unicast to a peer the router cannot reach.
	ErrUnknownPeer = errors.New("gossip: unknown peer")
	// ErrStopped marks use of a stopped router.
	ErrStopped = errors.New("gossip: router stopped")
)
