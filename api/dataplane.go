package api

// The values of NetworkConfig.Dataplane.
const (
	// DataplaneVXLAN reaches every peer through VXLAN (the default).
	DataplaneVXLAN = "vxlan"
	// DataplaneRouted routes the blocks of the peers on an agent's own
	// underlay segment via their underlay IPs, with no encapsulation, and
	// reaches the others through VXLAN (docs/design.md, "Dataplane").
	DataplaneRouted = "routed"
)

// DataplaneModes lists NetworkConfig.Dataplane's valid values ("": VXLAN).
var DataplaneModes = []string{"", DataplaneVXLAN, DataplaneRouted}
