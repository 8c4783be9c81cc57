package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/carve-net/carve/api"
)

// Command kinds in the Raft log.
const (
	opRegister     = "register"
	opDelete       = "delete"
	opSetConfig    = "set_config"
	opServerMeta   = "server_meta"
	opSetClusterID = "set_cluster_id"
	opCompact      = "compact"
	opReport       = "report"
	opGrow         = "grow"
	opReturn       = "return"
	opGrant        = "grant"
	opRelease      = "release_quarantine"
)

// maxClusterIDLen bounds a cluster id in the log.
const maxClusterIDLen = 64

// command is one Raft log entry. Everything non-deterministic (request ids,
// the cluster id, the leader's config file) is decided before it enters the
// log; applying it depends only on the state and the command.
type command struct {
	Op         string             `json:"op"`
	RequestID  string             `json:"request_id,omitempty"`
	Register   *registerCmd       `json:"register,omitempty"`
	Delete     *deleteCmd         `json:"delete,omitempty"`
	SetConfig  *api.NetworkConfig `json:"set_config,omitempty"`
	ServerMeta *ServerMeta        `json:"server_meta,omitempty"`
	ClusterID  string             `json:"cluster_id,omitempty"`
	Compact    *compactCmd        `json:"compact,omitempty"`
	Report     *reportCmd         `json:"report,omitempty"`
	Grow       *growCmd           `json:"grow,omitempty"`
	Return     *returnCmd         `json:"return,omitempty"`
	Grant      *grantCmd          `json:"grant,omitempty"`
	Release    *releaseCmd        `json:"release,omitempty"`
	Revoke     *revokeCmd         `json:"revoke,omitempty"`
	Restore    *restoreCmd        `json:"restore,omitempty"`
}

// reportCmd is an agent's configuration report (PUT .../report).
type reportCmd struct {
	AgentID string            `json:"agent_id"`
	Report  api.ReportRequest `json:"report"`
}

// growCmd leases one more block to an agent (POST .../blocks).
type growCmd struct {
	AgentID string `json:"agent_id"`
	Overlay string `json:"overlay"`
	Bridge  string `json:"bridge"`
	Family  int    `json:"family"` // 4 or 6
}

// returnCmd gives back what an agent holds inside Prefix.
type returnCmd struct {
	AgentID string       `json:"agent_id"`
	Overlay string       `json:"overlay"`
	Prefix  netip.Prefix `json:"prefix"`
}

// grantCmd records a ring grant: a transfer of Prefix from Donor to Recipient.
type grantCmd struct {
	Overlay   string       `json:"overlay"`
	Prefix    netip.Prefix `json:"prefix"`
	Donor     string       `json:"donor"`
	Recipient string       `json:"recipient"`
	Bridge    string       `json:"bridge"`
	// Statement names the donor's signed statement a recipient reported
	// the grant with (the SHA-256 of its signature, hex) and Expires is
	// when it expires (Unix seconds): a statement moves space once.
	Statement string `json:"statement,omitempty"`
	Expires   int64  `json:"expires,omitempty"`
}

// releaseCmd lifts the quarantine that every live agent's acknowledgement
// covers. The leader builds it from the usage reports it received; applying
// it checks the acknowledgements against the records at that point of the
// log, so an agent registered in between holds the release back.
type releaseCmd struct {
	Acks map[string]holdingsAck `json:"acks"`
}

// holdingsAck says that agent record Created reported, when it had merged
// the masters' state up to Index, every block it holds, and that the
// masters knew each of them as its own.
type holdingsAck struct {
	Created uint64 `json:"created"`
	Index   uint64 `json:"index"`
}

type registerCmd struct {
	AgentID  string                 `json:"agent_id"`
	Hostname string                 `json:"hostname,omitempty"`
	IP       string                 `json:"ip"`
	MeshAddr string                 `json:"mesh_addr,omitempty"`
	Bridges  api.AgentNetworkConfig `json:"bridges"`
	// Keys and UnderlayMTU came with record format v3; absent in entries
	// written before.
	Keys        api.AgentKeys `json:"keys,omitzero"`
	UnderlayMTU int           `json:"underlay_mtu,omitempty"`
	// CarveVersion is the agent's carve version (informational).
	CarveVersion string `json:"carve_version,omitempty"`
}

type deleteCmd struct {
	// Agents are ids or underlay IPs.
	Agents []string `json:"agents"`
	// Strict makes an unknown name without a tombstone an error (single DELETE).
	Strict bool `json:"strict,omitempty"`
}

// ServerMeta records a master's HTTP address so that followers can proxy
// writes to the leader and /cluster/status can name it.
type ServerMeta struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

// validate checks that a decoded command carries the body its op needs.
func (c command) validate() error {
	missing := false
	switch c.Op {
	case opRegister:
		missing = c.Register == nil
	case opDelete:
		missing = c.Delete == nil
	case opSetConfig:
		missing = c.SetConfig == nil
	case opServerMeta:
		missing = c.ServerMeta == nil
	case opCompact:
		missing = c.Compact == nil
		if !missing && (c.Compact.Now <= 0 || c.Compact.MaxAge <= 0) {
			return fmt.Errorf("%w: compact with now %d and max_age %d: want both positive", ErrBadCommand, c.Compact.Now, c.Compact.MaxAge)
		}
	case opReport:
		missing = c.Report == nil
	case opGrow:
		missing = c.Grow == nil
	case opReturn:
		missing = c.Return == nil
	case opGrant:
		missing = c.Grant == nil
	case opRelease:
		missing = c.Release == nil
	case opRevoke:
		missing = c.Revoke == nil
	case opRestore:
		missing = c.Restore == nil
	case opSetClusterID:
		if len(c.ClusterID) > maxClusterIDLen {
			return fmt.Errorf("%w: cluster_id longer than %d bytes", ErrBadCommand, maxClusterIDLen)
		}
		missing = c.ClusterID == ""
	default:
		return fmt.Errorf("%w: unknown op %q", ErrBadCommand, c.Op)
	}
	if missing {
		return fmt.Errorf("%w: %s without body", ErrBadCommand, c.Op)
	}
	return nil
}

func encodeCommand(c command) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %s command: %w", c.Op, err)
	}
	return b, nil
}

// commandDigest identifies what a request asks for (its op and body, not its
// request id), so that a retry can be told from another request that reuses
// the id. It is computed from the decoded command, hence the same on every
// replica.
func commandDigest(c command) string {
	c.RequestID = ""
	b, _ := json.Marshal(c) // the command was decoded from JSON: it encodes
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// Result is what applying a command hands back to its proposer.
type Result struct {
	Agent    *api.AgentInfo
	Deleted  []string
	Warnings []string
	// ConfigChanged: a configuration command changed the committed one.
	ConfigChanged bool
	// Released is the number of quarantined blocks a release freed.
	Released int
	Err      error
}
