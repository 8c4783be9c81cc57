package api

import (
	"context"
	"net/http"
)

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

// Config reads the committed network configuration.
func (c *Client) Config(ctx context.Context) (*ConfigAnswer, error) {
	var out ConfigAnswer
	if err := c.do(ctx, http.MethodGet, "/cluster/config", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ApplyConfig commits cfg as the cluster's network configuration (merged
// as the masters merge every configuration: leased overlays keep their
// subnets), or with dryRun only says what it would change.
func (c *Client) ApplyConfig(ctx context.Context, cfg NetworkConfig, dryRun bool) (*ConfigAnswer, error) {
	path := "/cluster/config"
	if dryRun {
		path += "?dry_run=true"
	}
	var out ConfigAnswer
	if err := c.do(ctx, http.MethodPut, path, cfg, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
