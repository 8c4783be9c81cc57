package apiclient

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/carve-net/carve/api"
)

// The operators' calls: the committed network configuration, the lease
// table's snapshot and its restore, the deny list of certificates.

// Config reads the committed network configuration.
func (c *Client) Config(ctx context.Context) (*api.ConfigAnswer, error) {
	var out api.ConfigAnswer
	if err := c.do(ctx, http.MethodGet, "/cluster/config", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ApplyConfig commits cfg as the cluster's network configuration (merged
// as the masters merge every configuration: leased overlays keep their
// subnets), or with dryRun only says what it would change.
func (c *Client) ApplyConfig(ctx context.Context, cfg api.NetworkConfig, dryRun bool) (*api.ConfigAnswer, error) {
	path := "/cluster/config"
	if dryRun {
		path += "?dry_run=true"
	}
	var out api.ConfigAnswer
	if err := c.do(ctx, http.MethodPut, path, cfg, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Snapshot reads the lease table from the leader after a read barrier
// (GET /cluster/snapshot, operator certificate): the file carve snapshot
// save writes.
func (c *Client) Snapshot(ctx context.Context) ([]byte, error) {
	var out json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/cluster/snapshot", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RestoreSnapshot replaces the lease table with a snapshot Snapshot read
// (POST /cluster/restore, operator certificate) and returns the restore.
func (c *Client) RestoreSnapshot(ctx context.Context, snapshot []byte) (*api.Restore, error) {
	var out api.Restore
	if err := c.do(ctx, http.MethodPost, "/cluster/restore", api.RestoreRequest{Snapshot: snapshot}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Revoke puts a certificate on the masters' deny list (operator or
// master certificate); idempotent. A RequestID is generated when empty.
func (c *Client) Revoke(ctx context.Context, req api.RevokeRequest) (*api.Revocations, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.Revocations
	if err := c.do(ctx, http.MethodPost, "/cluster/revocations", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Revocations reads the masters' deny list.
func (c *Client) Revocations(ctx context.Context) (*api.Revocations, error) {
	var out api.Revocations
	if err := c.do(ctx, http.MethodGet, "/cluster/revocations", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
