package master

import (
	"encoding/json"
	"fmt"

	"github.com/carve-net/carve/api"
)

// Command kinds in the Raft log.
const (
	opRegister   = "register"
	opDelete     = "delete"
	opSetConfig  = "set_config"
	opServerMeta = "server_meta"
)

// command is one Raft log entry. Everything non-deterministic (request ids,
// the leader's config file) is decided before it enters the log; applying it
// depends only on the state and the command.
type command struct {
	Op         string             `json:"op"`
	RequestID  string             `json:"request_id,omitempty"`
	Register   *registerCmd       `json:"register,omitempty"`
	Delete     *deleteCmd         `json:"delete,omitempty"`
	SetConfig  *api.NetworkConfig `json:"set_config,omitempty"`
	ServerMeta *serverMeta        `json:"server_meta,omitempty"`
}

type registerCmd struct {
	AgentID  string                 `json:"agent_id"`
	Hostname string                 `json:"hostname,omitempty"`
	IP       string                 `json:"ip"`
	MeshAddr string                 `json:"mesh_addr,omitempty"`
	Bridges  api.AgentNetworkConfig `json:"bridges"`
}

type deleteCmd struct {
	// Agents are ids or underlay IPs.
	Agents []string `json:"agents"`
	// Strict makes an unknown name without a tombstone an error (single DELETE).
	Strict bool `json:"strict,omitempty"`
}

// serverMeta records a master's HTTP address so that followers can proxy
// writes to the leader and /cluster/status can name it.
type serverMeta struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

func encodeCommand(c command) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %s command: %w", c.Op, err)
	}
	return b, nil
}

// applyResult is what applying a command hands back to its proposer.
type applyResult struct {
	Agent    *api.AgentInfo
	Deleted  []string
	Warnings []string
	Err      error
}
