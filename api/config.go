package api

// ConfigAnswer is the masters' committed network configuration, the one
// authority for it (GET and PUT /cluster/config). A master's --config file
// is only the value a new cluster starts with: the configuration changes
// only by an operator's PUT (carve config apply), committed through Raft.
type ConfigAnswer struct {
	Config NetworkConfig `json:"config"`
	// Changed tells whether a PUT changed (or, with dry_run, would
	// change) the committed configuration.
	Changed bool `json:"changed"`
	// Warnings are what the merge kept from the file (a leased overlay's
	// subnets, a VTEP subnet in use) or left out.
	Warnings []string `json:"warnings,omitempty"`
	// DryRun: nothing was committed.
	DryRun bool `json:"dry_run,omitempty"`
}
