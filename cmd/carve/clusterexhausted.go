package main

import (
	"fmt"
	"strings"

	"github.com/carve-net/carve/api"
)

// judgeExhaustion reports the overlays that cannot give an agent a subnet
// or a container an address, as the leader sees them (it alone receives
// the agents' usage reports); without a leader, as the first master that
// answered sees the subnets.
func judgeExhaustion(rep *clusterReport) []string {
	var view *api.ClusterStatus
	for _, v := range rep.Masters {
		if v.Status == nil {
			continue
		}
		if view == nil || v.Status.Role == "leader" {
			view = v.Status
		}
	}
	if view == nil {
		return nil
	}
	var problems []string
	for _, ex := range view.ExhaustedOverlays {
		what := fmt.Sprintf("overlay %s (IPv%d)", ex.Overlay, ex.Family)
		if ex.UnleasedCount > 0 {
			names := strings.Join(ex.Unleased, ", ")
			if more := ex.UnleasedCount - len(ex.Unleased); more > 0 {
				names += fmt.Sprintf(" and %d more", more)
			}
			problems = append(problems, fmt.Sprintf("%s is exhausted: %d agents have no subnet of it (%s): every subnet is leased; delete agents gone for good or add an overlay (docs/troubleshooting.md, a full overlay)",
				what, ex.UnleasedCount, names))
		}
		if ex.Full {
			problems = append(problems, fmt.Sprintf("%s is full: no block is left to grow into and its agents report no free address; ADDs fail with exhausted (docs/troubleshooting.md, a full overlay)", what))
		}
	}
	return problems
}
