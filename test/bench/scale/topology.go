package main

import (
	"fmt"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/test/lab/benchtable"
	"github.com/weaveworks/mesh"
)

// topologyBytesRows measures, in process and deterministically, what mesh's
// own topology gossip puts on one connection at n agents with the default
// number of mesh connections each (third_party/mesh, see its PATCHED.md):
// the periodic digest, one connection change, and the repair of a neighbour
// that missed that change, beside the whole topology that every periodic
// round sent to every neighbour before, built from the same topology.
func topologyBytesRows(n int) ([]benchtable.Row, error) {
	c, err := mesh.MeasureTopologyCost(n, agent.DefaultMeshPeers)
	if err != nil {
		return nil, err
	}
	base := "whole topology (mesh's periodic gossip before, to each neighbour)"
	note := fmt.Sprintf("%d mesh connections a peer; message bodies, before framing and encryption", c.Degree)
	return []benchtable.Row{
		{Name: fmt.Sprintf("gossip, mesh topology: periodic round, in sync (%d agents)", n), Value: float64(c.Digest), Unit: "B/conn/round",
			Baseline: base, BaseVal: float64(c.Full), Note: "the digest alone; " + note},
		{Name: fmt.Sprintf("gossip, mesh topology: one connection change (%d agents)", n), Value: float64(c.Change), Unit: "B/msg",
			Baseline: base, BaseVal: float64(c.Full), Note: "the two changed entries, relayed as news; " + note},
		{Name: fmt.Sprintf("gossip, mesh topology: round repairing a missed change (%d agents)", n), Value: float64(c.Repair), Unit: "B/round",
			Baseline: base, BaseVal: float64(c.Full), Note: fmt.Sprintf("%d messages: digest, buckets, summary, want, entries; %s", c.RepairMessages, note)},
	}, nil
}
