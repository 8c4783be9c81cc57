// Package gset is a grow-only set of strings gossiped over a channel: the
// simplest state-based CRDT, for testing routers.
package gset

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/carve-net/carve/gossip"
)

// Data is a set snapshot.
type Data []string

// Encode writes the set as newline-separated items.
func (d Data) Encode() [][]byte { return [][]byte{[]byte(strings.Join(d, "\n"))} }

// Merge is set union.
func (d Data) Merge(o gossip.Data) gossip.Data {
	od, ok := o.(Data)
	if !ok {
		return d
	}
	return union(d, od)
}

func union(a, b []string) Data {
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		m[x] = true
	}
	out := make(Data, 0, len(m))
	for x := range m {
		out = append(out, x)
	}
	sort.Strings(out)
	return out
}

func decode(b []byte) Data {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\n")
}

// Unicast is a received unicast.
type Unicast struct {
	From string
	Msg  string
}

// Handler keeps one peer's set and records unicasts; safe for concurrent use.
type Handler struct {
	mu       sync.Mutex
	set      Data
	unicasts []Unicast
	echo     gossip.Channel
	srcs     map[string]bool
}

// SetEcho makes the handler answer every unicast through c with "re:" and
// the message.
func (h *Handler) SetEcho(c gossip.Channel) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.echo = c
}

// BroadcastSources returns the peers broadcasts came from, sorted.
func (h *Handler) BroadcastSources() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for s := range h.srcs {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Add puts items in the set and returns the new snapshot.
func (h *Handler) Add(items ...string) Data {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.set = union(h.set, items)
	return slices.Clone(h.set)
}

// Set returns the current set.
func (h *Handler) Set() Data {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.set)
}

// Unicasts returns the unicasts received so far.
func (h *Handler) Unicasts() []Unicast {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.unicasts)
}

func (h *Handler) merge(b []byte) (news bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := union(h.set, decode(b))
	news = len(n) != len(h.set)
	h.set = n
	return news
}

// Gossip returns the whole set.
func (h *Handler) Gossip() gossip.Data {
	s := h.Set()
	if len(s) == 0 {
		return nil
	}
	return s
}

// OnGossip merges and returns the set when it grew.
func (h *Handler) OnGossip(msg []byte) (gossip.Data, error) {
	if strings.Contains(string(msg), "\x00") {
		return nil, fmt.Errorf("gset: NUL in message")
	}
	if h.merge(msg) {
		return h.Set(), nil
	}
	return nil, nil
}

// OnBroadcast merges and relays the set.
func (h *Handler) OnBroadcast(src string, msg []byte) (gossip.Data, error) {
	h.mu.Lock()
	if h.srcs == nil {
		h.srcs = map[string]bool{}
	}
	h.srcs[src] = true
	h.mu.Unlock()
	if h.merge(msg) {
		return h.Set(), nil
	}
	return nil, nil
}

// OnUnicast records the message and echoes it when asked to.
func (h *Handler) OnUnicast(src string, msg []byte) error {
	h.mu.Lock()
	h.unicasts = append(h.unicasts, Unicast{src, string(msg)})
	echo := h.echo
	h.mu.Unlock()
	if echo != nil && !strings.HasPrefix(string(msg), "re:") {
		return echo.Unicast(src, append([]byte("re:"), msg...))
	}
	return nil
}
