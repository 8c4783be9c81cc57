// Package logcmd is what enters the masters' Raft log: the commands (their
// wire types, whose JSON is the log's format), the constructors that
// validate an API request into one and name the bad field and its fix,
// their encoding and digest, and the decoding of a log entry that every
// replica applies (Decode: a command with the body its op needs, or an
// error wrapping ErrBadCommand). Everything non-deterministic (request
// ids, the cluster id, the leader's configuration file, the leader's
// clock) is in the command before it enters the log, so that applying it
// (package master/state) depends only on the state and the command. It
// imports nothing of ours but api, master/netconfig's prefix parsing and
// master/record's report validation.
package logcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
)

// Command kinds in the Raft log (Command.Op).
const (
	OpRegister     = "register"
	OpDelete       = "delete"
	OpSetConfig    = "set_config"
	OpServerMeta   = "server_meta"
	OpSetClusterID = "set_cluster_id"
	OpCompact      = "compact"
	OpReport       = "report"
	OpGrow         = "grow"
	OpReturn       = "return"
	OpGrant        = "grant"
	OpRelease      = "release_quarantine"
	// OpRevoke puts a certificate on the deny list (Revoke).
	OpRevoke = "revoke"
	// OpRestore replaces the table with a snapshot (Restore).
	OpRestore = "restore"
)

// ErrBadCommand marks a log entry that cannot be decoded (never written by
// us): not JSON, an unknown op, or an op without its body.
var ErrBadCommand = errors.New("undecodable command")

// Command is one Raft log entry: an op and the body it needs, made by the
// constructors below. Its JSON is the log's format: every field's tag is
// read back by every replica, and by masters of the next release.
type Command struct {
	Op         string             `json:"op"`
	RequestID  string             `json:"request_id,omitempty"`
	Register   *Register          `json:"register,omitempty"`
	Delete     *Delete            `json:"delete,omitempty"`
	SetConfig  *api.NetworkConfig `json:"set_config,omitempty"`
	ServerMeta *ServerMeta        `json:"server_meta,omitempty"`
	ClusterID  string             `json:"cluster_id,omitempty"`
	Compact    *Compact           `json:"compact,omitempty"`
	Report     *Report            `json:"report,omitempty"`
	Grow       *Grow              `json:"grow,omitempty"`
	Return     *Return            `json:"return,omitempty"`
	Grant      *Grant             `json:"grant,omitempty"`
	Release    *Release           `json:"release,omitempty"`
	Revoke     *Revoke            `json:"revoke,omitempty"`
	Restore    *Restore           `json:"restore,omitempty"`
}

// Register registers (or updates) an agent.
type Register struct {
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

// Delete deletes agents.
type Delete struct {
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

// Compact compacts tombstones: Now is the leader's clock, MaxAge the age
// (both in milliseconds) beyond which a tombstone is dropped.
type Compact struct {
	Now    int64 `json:"now"`
	MaxAge int64 `json:"max_age"`
}

// Report is an agent's configuration report (PUT .../report).
type Report struct {
	AgentID string            `json:"agent_id"`
	Report  api.ReportRequest `json:"report"`
}

// Grow leases one more block to an agent (POST .../blocks).
type Grow struct {
	AgentID string `json:"agent_id"`
	Overlay string `json:"overlay"`
	Bridge  string `json:"bridge"`
	Family  int    `json:"family"` // 4 or 6
}

// Return gives back what an agent holds inside Prefix.
type Return struct {
	AgentID string       `json:"agent_id"`
	Overlay string       `json:"overlay"`
	Prefix  netip.Prefix `json:"prefix"`
	// Version and RestoreEpoch name the lease of the block the returner
	// gives back (api.ReturnRequest); Version 0: not named.
	Version      uint64 `json:"version,omitempty"`
	RestoreEpoch uint64 `json:"restore_epoch,omitempty"`
}

// Grant records a ring grant: a transfer of Prefix from Donor to Recipient.
type Grant struct {
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

// Release lifts the quarantine that every live agent's acknowledgement
// covers. The leader builds it from the usage reports it received; applying
// it checks the acknowledgements against the records at that point of the
// log, so an agent registered in between holds the release back.
type Release struct {
	Acks map[string]HoldingsAck `json:"acks"`
}

// HoldingsAck says that agent record Created reported, when it had merged
// the masters' state up to Index, every block it holds, and that the
// masters knew each of them as its own.
type HoldingsAck struct {
	Created uint64 `json:"created"`
	Index   uint64 `json:"index"`
}

// Revoke revokes the certificate of Serial (api.CanonicalSerial); with an
// agent Identity, that agent's record is deleted in the same entry.
type Revoke struct {
	Serial   string `json:"serial"`
	Identity string `json:"identity,omitempty"`
	NotAfter int64  `json:"not_after,omitempty"`
}

// Restore is a restore: the snapshot as GET /cluster/snapshot wrote it,
// and the epoch the leader chose (RestoreCommand).
type Restore struct {
	Epoch    uint64          `json:"epoch"`
	Snapshot json.RawMessage `json:"snapshot"`
	// Quarantine: the restore quarantines the space of the agents it
	// deletes (those its snapshot lacks, and revoked ones), as a delete
	// does. Every restore proposed since v0.5 says so; one of an earlier
	// release's log replays as it was applied then, freeing that space,
	// so that replicas that apply the same log stay the same.
	Quarantine bool `json:"quarantine,omitempty"`
	// KeepLive: the restore leaves each agent it keeps every block the
	// table before leased it (grown, granted, or a newer first lease,
	// after the snapshot): the agent's containers hold addresses there,
	// and the snapshot's claims on that space give way. Every restore
	// proposed since v0.5 says so; one without it replays as it was
	// applied, taking those blocks back.
	KeepLive bool `json:"keep_live,omitempty"`
}

// Decode reads one Raft log entry: a command whose op is known and that
// carries the body its op needs; any other entry is an error wrapping
// ErrBadCommand, and never a panic (the log is replayed by every follower).
func Decode(data []byte) (Command, error) {
	var c Command
	if err := json.Unmarshal(data, &c); err != nil {
		return Command{}, fmt.Errorf("%w: %v", ErrBadCommand, err)
	}
	if err := c.validate(); err != nil {
		return Command{}, err
	}
	return c, nil
}

// Encode is the command as a Raft log entry.
func (c Command) Encode() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %s command: %w", c.Op, err)
	}
	return b, nil
}

// Digest identifies what a request asks for (its op and body, not its
// request id), so that a retry can be told from another request that
// reuses the id. It is computed from the decoded command, hence the same
// on every replica.
func (c Command) Digest() string {
	c.RequestID = ""
	b, _ := json.Marshal(c) // the command was decoded from JSON: it encodes
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// The constructors below build the commands the masters propose, each from
// its request. One that takes an API request validates it first and names
// the bad field and how to fix it: the server answers that error 400.

// RegisterCommand registers (or updates) an agent, after
// ValidateRegistration.
func RegisterCommand(req api.RegisterRequest) (Command, error) {
	if err := ValidateRegistration(&req); err != nil {
		return Command{}, err
	}
	return Command{Op: OpRegister, RequestID: req.RequestID, Register: &Register{
		AgentID: req.AgentID, Hostname: req.Hostname, IP: req.IP, MeshAddr: req.MeshAddr, Bridges: req.NetworkConfig,
		Keys: req.Keys, UnderlayMTU: req.UnderlayMTU, CarveVersion: req.CarveVersion,
	}}, nil
}

// ValidateRegistration checks a registration and names the bad field.
func ValidateRegistration(req *api.RegisterRequest) error {
	if req.AgentID == "" {
		return errors.New("agent_id is required")
	}
	if err := api.ValidateAgentID(req.AgentID); err != nil {
		return fmt.Errorf("agent_id: %w", err)
	}
	if req.IP == "" {
		return errors.New("ip is required (the agent's underlay address)")
	}
	ip, err := netip.ParseAddr(req.IP)
	if err != nil || ip.Zone() != "" {
		return fmt.Errorf("ip %q is not an IP address", req.IP)
	}
	if ip.Is4In6() {
		return fmt.Errorf("ip %q: write IPv4 addresses in dotted form", req.IP)
	}
	if ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() || (ip.Is4() && ip == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
		return fmt.Errorf("ip %q cannot be an agent's underlay address", req.IP)
	}
	if len(req.Hostname) > 253 || strings.ContainsFunc(req.Hostname, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return fmt.Errorf("hostname %q: want at most 253 printable characters", req.Hostname)
	}
	if req.MeshAddr != "" {
		host, port, err := net.SplitHostPort(req.MeshAddr)
		if err != nil || host == "" {
			return fmt.Errorf("mesh_addr %q: want HOST:PORT", req.MeshAddr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("mesh_addr %q: port must be 1-65535", req.MeshAddr)
		}
	}
	if err := req.Keys.Validate(); err != nil {
		return err
	}
	if err := api.ValidateUnderlayMTU(req.UnderlayMTU); err != nil {
		return err
	}
	return validateRequestID(req.RequestID)
}

// ReportCommand records agentID's configuration report.
func ReportCommand(agentID string, req api.ReportRequest) (Command, error) {
	if err := api.ValidateAgentID(agentID); err != nil {
		return Command{}, err
	}
	if _, err := record.ReportOf(req); err != nil {
		return Command{}, err
	}
	if err := validateRequestID(req.RequestID); err != nil {
		return Command{}, err
	}
	// The request id is the command's; the stored report has none.
	requestID := req.RequestID
	req.RequestID = ""
	return Command{Op: OpReport, RequestID: requestID, Report: &Report{AgentID: agentID, Report: req}}, nil
}

// DeleteAgentCommand deletes one agent by id or underlay IP; applying it
// fails for a name neither known nor deleted before.
func DeleteAgentCommand(name string) Command {
	return Command{Op: OpDelete, Delete: &Delete{Agents: []string{name}, Strict: true}}
}

// DeleteAgentsCommand deletes agents by id or underlay IP (DC/OS's bulk
// delete); unknown names are skipped.
func DeleteAgentsCommand(req api.DeleteAgentsRequest) (Command, error) {
	if len(req.Agents) == 0 {
		return Command{}, errors.New("agents: want a non-empty list of agent ids or IPs")
	}
	for i, a := range req.Agents {
		if a == "" {
			return Command{}, fmt.Errorf("agents[%d] is empty", i)
		}
	}
	if err := validateRequestID(req.RequestID); err != nil {
		return Command{}, err
	}
	return Command{Op: OpDelete, RequestID: req.RequestID, Delete: &Delete{Agents: req.Agents}}, nil
}

// GrowCommand leases agentID one more block of the overlay and family the
// request names.
func GrowCommand(agentID string, req api.GrowRequest) (Command, error) {
	family, err := validateGrow(&req)
	if err != nil {
		return Command{}, err
	}
	if err := api.ValidateAgentID(agentID); err != nil {
		return Command{}, err
	}
	return Command{Op: OpGrow, RequestID: req.RequestID, Grow: &Grow{AgentID: agentID, Overlay: req.Overlay, Bridge: req.Bridge, Family: family}}, nil
}

// ReturnCommand gives back what agentID holds inside the request's prefix.
func ReturnCommand(agentID string, req api.ReturnRequest) (Command, error) {
	p, err := parseBlockPrefix("prefix", req.Prefix)
	if err != nil {
		return Command{}, err
	}
	if err := api.ValidateOverlayName(req.Overlay); err != nil {
		return Command{}, err
	}
	if err := validateRequestID(req.RequestID); err != nil {
		return Command{}, err
	}
	if req.Version == 0 && req.RestoreEpoch != 0 {
		return Command{}, fmt.Errorf("restore_epoch: %d without the block's version: send both, or neither", req.RestoreEpoch)
	}
	return Command{Op: OpReturn, RequestID: req.RequestID, Return: &Return{AgentID: agentID, Overlay: req.Overlay, Prefix: p,
		Version: req.Version, RestoreEpoch: req.RestoreEpoch}}, nil
}

// GrantCommand records a ring grant that reporter (its donor or its
// recipient) reports.
func GrantCommand(reporter string, req api.GrantReport) (Command, error) {
	if err := validateGrantReport(reporter, &req); err != nil {
		return Command{}, err
	}
	p, _ := parseBlockPrefix("prefix", req.Prefix) // validated
	g := &Grant{Overlay: req.Overlay, Prefix: p, Donor: req.Donor, Recipient: req.Recipient, Bridge: req.Bridge}
	if req.DonorSignature != "" {
		g.Statement, g.Expires = StatementID(req.DonorSignature), req.Expires
	}
	return Command{Op: OpGrant, RequestID: req.RequestID, Grant: g}, nil
}

// StatementID names a donor's signed grant statement: the SHA-256 of its
// signature (hex). The masters keep the ids of the statements that moved
// space until they expire.
func StatementID(signature string) string {
	sum := sha256.Sum256([]byte(signature))
	return hex.EncodeToString(sum[:])
}

// ReleaseCommand lifts the quarantine that acks, the agents' holdings
// acknowledgements by agent id, cover.
func ReleaseCommand(acks map[string]HoldingsAck) Command {
	return Command{Op: OpRelease, Release: &Release{Acks: acks}}
}

// SetConfigCommand merges a network configuration into the committed one
// (netconfig.Merge); the leader proposes its file's.
func SetConfigCommand(cfg api.NetworkConfig) Command {
	return Command{Op: OpSetConfig, SetConfig: &cfg}
}

// ServerMetaCommand records a master's addresses.
func ServerMetaCommand(meta ServerMeta) Command {
	return Command{Op: OpServerMeta, ServerMeta: &meta}
}

// ClusterIDCommand commits the cluster id, unless one is committed already.
func ClusterIDCommand(id string) Command {
	return Command{Op: OpSetClusterID, ClusterID: id}
}

// CompactCommand drops the tombstones older than maxAge (at least a
// millisecond) by the leader's clock now.
func CompactCommand(now time.Time, maxAge time.Duration) Command {
	return Command{Op: OpCompact, Compact: &Compact{Now: now.UnixMilli(), MaxAge: max(maxAge.Milliseconds(), 1)}}
}

// RevokeCommand puts a certificate on the deny list, after checking the
// request: a hex serial, an identity of the form role/name when given.
func RevokeCommand(req api.RevokeRequest) (Command, error) {
	serial, err := api.CanonicalSerial(req.Serial)
	if err != nil {
		return Command{}, err
	}
	if req.Identity != "" {
		role, name, ok := strings.Cut(req.Identity, "/")
		if !ok || (role != "master" && role != "agent" && role != "operator") {
			return Command{}, fmt.Errorf("identity %q: want role/name with role master, agent or operator", req.Identity)
		}
		if err := api.ValidateAgentID(name); err != nil {
			return Command{}, fmt.Errorf("identity %q: %w", req.Identity, err)
		}
	}
	if req.NotAfter < 0 {
		return Command{}, fmt.Errorf("not_after %d: want Unix seconds", req.NotAfter)
	}
	if err := validateRequestID(req.RequestID); err != nil {
		return Command{}, err
	}
	return Command{Op: OpRevoke, RequestID: req.RequestID, Revoke: &Revoke{Serial: serial, Identity: req.Identity, NotAfter: req.NotAfter}}, nil
}

// RestoreCommand restores the snapshot data (check it first) at the epoch
// now gives, when that is above the table's last one.
func RestoreCommand(data []byte, now time.Time) Command {
	return Command{Op: OpRestore, Restore: &Restore{Epoch: uint64(max(now.UnixNano(), 1)), Snapshot: data, Quarantine: true, KeepLive: true}}
}
