package labcluster

// The cluster's containers as endpoints of probelab's probes, and the names
// the tests have always called them by.

import (
	"context"
	"net/netip"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/probelab"
)

// PingAttempts is probelab.PingAttempts.
const PingAttempts = probelab.PingAttempts

// PingResult is one cell of a ping matrix (probelab.PingResult).
type PingResult = probelab.PingResult

// PingMatrix is a ping matrix over the cluster's containers.
type PingMatrix = probelab.PingMatrix[*Container]

// PingWatch is probelab.PingWatch.
type PingWatch = probelab.PingWatch

// PingWindow is one ordered pair's record of a PingWatch.
type PingWindow = probelab.PingWindow

// Capture is a running tcpdump on the underlay bridge (probelab.Capture).
type Capture = probelab.Capture

// Packet is one IPv4 packet seen on the underlay (probelab.Packet).
type Packet = probelab.Packet

// Ping runs probelab's ping matrix over cs.
func Ping(ctx context.Context, cs []*Container) *PingMatrix { return probelab.Ping(ctx, cs) }

// WatchPings starts probelab's continuous pings between the containers of
// cs on different hosts, one echo per interval each, until Stop.
func WatchPings(ctx context.Context, cs []*Container, interval time.Duration) *PingWatch {
	return probelab.WatchPings(ctx, cs, interval)
}

// FormatPingWindows is a table of the records, one pair a line.
func FormatPingWindows(ws []PingWindow) string { return probelab.FormatPingWindows(ws) }

// StartCapture starts tcpdump on the underlay bridge (probelab.StartCapture).
func (c *Cluster) StartCapture(ctx context.Context) (*Capture, error) {
	return probelab.StartCapture(ctx, c.Lab)
}

// PingFrom is the container's namespace, where its echoes leave from.
func (c *Container) PingFrom() *netnslab.Namespace { return c.NS.Namespace }

// PingAddr is the container's address, where echoes to it go.
func (c *Container) PingAddr() netip.Addr { return c.Addr.Addr() }

// SameHost reports whether other is a container of the same host.
func (c *Container) SameHost(other probelab.Endpoint) bool {
	o, ok := other.(*Container)
	return ok && o.Host == c.Host
}
