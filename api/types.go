// Package api holds the wire types (JSON, snake_case, DC/OS overlay compatible)
// of the carve master and agent HTTP APIs, the one JSON-over-HTTP call, and
// a Go client of the agent's API (the masters' client is api/apiclient).
//
// Addresses travel as strings, as in DC/OS's overlay.proto: the servers
// validate them and name the offending field in their errors.
package api

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Overlay statuses: DC/OS's overlay.proto enum Status, all four values and no
// other (DC/OS consumers refuse a value outside it). A disabled overlay is
// not a status: it is "enabled": false in the network configuration, and it
// is not leased.
const (
	StatusInvalid     = "STATUS_INVALID"
	StatusOK          = "STATUS_OK"
	StatusFailed      = "STATUS_FAILED"
	StatusConfiguring = "STATUS_CONFIGURING"
)

// ValidReportedStatus tells whether an agent may report status s for an
// overlay: the enum's values but STATUS_INVALID (which means "unset").
func ValidReportedStatus(s string) bool {
	return s == StatusOK || s == StatusFailed || s == StatusConfiguring
}

// NoIP is what AgentInfo.IP holds when the agent has no underlay IP (a newer
// registration took its IP): DC/OS's AgentInfo.ip is required, and the
// unspecified address is a valid IPv4 address that no host has and that
// VXLAN never sends to, so a DC/OS consumer programs nothing reachable for
// it, and two such records never claim a real host's address.
const NoIP = "0.0.0.0"

// Error codes carried in Error.Code; clients branch on them.
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeConflict   = "conflict"
	CodeExhausted  = "exhausted"
	CodeTooLarge   = "too_large"
	CodeNoLeader   = "no_leader"
	CodeInternal   = "internal"
	CodeTimeout    = "timeout"
	// CodeUnavailable: the master cannot serve the request yet (no network
	// configuration committed, or the outcome of a write is unknown): retry.
	CodeUnavailable = "unavailable"
	// CodeUnauthenticated (HTTP 401): the request came without a client
	// certificate of the cluster CA that carries a carve role.
	CodeUnauthenticated = "unauthenticated"
	// CodeRevoked (HTTP 401): the request's client certificate is on the
	// masters' deny list (carve certs revoke); the holder needs a new
	// certificate, loaded without a restart (SIGHUP).
	CodeRevoked = "revoked"
	// CodeForbidden (HTTP 403): the certificate's role may not do this.
	CodeForbidden = "forbidden"
	// CodeGone (HTTP 410): GET /overlay-master/changes was asked for changes
	// since an index older than the masters keep (Error.Oldest is the
	// oldest they can serve): read the whole state instead.
	CodeGone = "gone"
	// CodeQuota (HTTP 409): the write would give an agent more grown and
	// granted space in an overlay than its quota (quota_prefix).
	CodeQuota = "quota"
)

// NetworkConfig is the masters' network configuration file (DC/OS NetworkConfig).
type NetworkConfig struct {
	VTEPSubnet string `json:"vtep_subnet,omitempty"`
	// VTEPSubnet6 (optional, DC/OS's vtep_subnet6, e.g. fd01:a::/64) gives
	// every agent an IPv6 VTEP address as well (VXLANInfo.VTEPIP6).
	VTEPSubnet6 string `json:"vtep_subnet6,omitempty"`
	VTEPMACOUI  string `json:"vtep_mac_oui,omitempty"`
	VTEPName    string `json:"vtep_name,omitempty"`
	VNI         uint32 `json:"vni,omitempty"`
	VTEPPort    uint16 `json:"vtep_port,omitempty"`
	VTEPMTU     int    `json:"vtep_mtu,omitempty"`
	OverlayMTU  int    `json:"overlay_mtu,omitempty"`
	// Encryption (carve extension) encrypts container traffic between
	// hosts: "" (off), EncryptionWireGuard or EncryptionWireGuardStrict.
	Encryption string `json:"encryption,omitempty"`
	// WireGuardPort is the UDP port of every agent's WireGuard device (0:
	// DefaultWireGuardPort).
	WireGuardPort uint16 `json:"wireguard_port,omitempty"`
	// Dataplane (carve extension) is how agents reach each other's
	// containers: "" or DataplaneVXLAN (every peer through VXLAN), or
	// DataplaneRouted (plain routes via the underlay IP to the peers on an
	// agent's own underlay segment, VXLAN to the others). Never with
	// Encryption.
	Dataplane string `json:"dataplane,omitempty"`
	// Segments (carve extension, with DataplaneRouted) are underlay
	// prefixes that are each one L2 segment: two agents whose IPs are both
	// inside one are routed to each other whatever their addresses'
	// prefix lengths say.
	Segments []string `json:"segments,omitempty"`
	// Overlays are the virtual networks; each agent gets a subnet of each enabled one.
	Overlays []OverlayNetwork `json:"overlays,omitempty"`
}

// OverlayNetwork is one virtual network of the configuration.
type OverlayNetwork struct {
	Name    string `json:"name"`
	Subnet  string `json:"subnet,omitempty"`
	Prefix  int    `json:"prefix,omitempty"`
	Subnet6 string `json:"subnet6,omitempty"`
	Prefix6 int    `json:"prefix6,omitempty"`
	// Enabled defaults to true; a pointer so that "absent" and "false" differ.
	Enabled *bool `json:"enabled,omitempty"`
	// GrowPrefix and GrowPrefix6 are the prefix lengths of the blocks an
	// agent grows by (POST .../blocks): a carve extension. 0 means the size
	// of a bridge's first sub-subnet (prefix+1: a /25 with the default /24).
	GrowPrefix  int `json:"grow_prefix,omitempty"`
	GrowPrefix6 int `json:"grow_prefix6,omitempty"`
	// QuotaPrefix and QuotaPrefix6 cap what one agent may hold of grown and
	// granted blocks in the overlay: at most the addresses of one prefix of
	// that length (a carve extension). 0 means the default: 16 times an
	// agent's subnet (prefix-4), but never more than the whole subnet.
	QuotaPrefix  int `json:"quota_prefix,omitempty"`
	QuotaPrefix6 int `json:"quota_prefix6,omitempty"`
}

// IsEnabled reports whether the overlay is enabled (absent means enabled).
func (o OverlayNetwork) IsEnabled() bool { return o.Enabled == nil || *o.Enabled }

// overlayNetworkJSON is OverlayNetwork without its MarshalJSON.
type overlayNetworkJSON OverlayNetwork

// MarshalJSON always writes "enabled" (true or false): DC/OS declares it
// with a default and always writes it, and its consumers (the UI) offer
// only overlays that say "enabled": true.
func (o OverlayNetwork) MarshalJSON() ([]byte, error) {
	enabled := o.IsEnabled()
	j := overlayNetworkJSON(o)
	j.Enabled = &enabled
	return json.Marshal(j)
}

// AgentNetworkConfig tells which bridges an agent wants.
type AgentNetworkConfig struct {
	MesosBridge  bool `json:"mesos_bridge"`
	DockerBridge bool `json:"docker_bridge"`
}

// RegisterRequest is the body of POST /overlay-master/agents.
type RegisterRequest struct {
	AgentID       string             `json:"agent_id"`
	Hostname      string             `json:"hostname,omitempty"`
	IP            string             `json:"ip"`
	MeshAddr      string             `json:"mesh_addr,omitempty"`
	NetworkConfig AgentNetworkConfig `json:"network_config"`
	// Keys are the public keys the agent made on its host (record format
	// v3): the masters sign them into its record.
	Keys AgentKeys `json:"keys,omitzero"`
	// WireGuardProofs prove that the agent holds the private half of
	// Keys.WireGuard, one per masters' signing key it knows (wgproof.go).
	// Not kept: a master checks them when an agent's certificate
	// registers, before it forwards.
	WireGuardProofs []WireGuardProof `json:"wireguard_proofs,omitempty"`
	// UnderlayMTU is the MTU of the agent's underlay device (0: not
	// reported); the masters sign it into the record so that hosts agree
	// on the smallest.
	UnderlayMTU int `json:"underlay_mtu,omitempty"`
	// RequestID makes a retry after an unknown outcome have one effect;
	// the client sets it once per logical request.
	RequestID string `json:"request_id,omitempty"`
	// CarveVersion is the agent's carve version (informational: kept in
	// its record as AgentInfo.CarveVersion, not signed).
	CarveVersion string `json:"carve_version,omitempty"`
}

// AgentInfo is an agent's record: its leases per overlay, versioned by the
// Raft index of the last change (DC/OS's AgentInfo, with carve's extensions
// as extra keys).
type AgentInfo struct {
	AgentID  string `json:"agent_id"`
	Hostname string `json:"hostname,omitempty"`
	// IP is the agent's underlay address; NoIP while it has none (DC/OS
	// requires the field). Use HasIP.
	IP            string             `json:"ip"`
	MeshAddr      string             `json:"mesh_addr,omitempty"`
	Version       uint64             `json:"version"`
	NetworkConfig AgentNetworkConfig `json:"network_config"`
	// Keys (carve extension) are the public keys the agent registered.
	Keys AgentKeys `json:"keys,omitzero"`
	// UnderlayMTU (carve extension) is the MTU of the agent's underlay
	// device as it registered it; 0 when it reported none.
	UnderlayMTU int `json:"underlay_mtu,omitempty"`
	// Overlays are the overlays leased to the agent (DC/OS leaves out an
	// overlay it cannot lease; NotLeased says why).
	Overlays []AgentOverlay `json:"overlays,omitempty"`
	// ConfigurationAttempts is DC/OS's AgentInfo field 3: in the masters'
	// records, the count the agent last reported (see ReportRequest); in
	// the agent's own endpoint, its reconciles of its current record.
	ConfigurationAttempts uint32 `json:"configuration_attempts"`
	// NotLeased (carve extension) names the enabled or configured overlays
	// (or one address family of them) the masters did not lease to this
	// agent, and why: no subnet left, or the overlay is disabled.
	NotLeased []NotLeased `json:"not_leased,omitempty"`
	// Signature is the masters' ed25519 signature of RecordSigningBytes,
	// standard base64; absent when the masters sign nothing (--insecure).
	Signature string `json:"signature,omitempty"`
	// CarveVersion (carve extension) is the carve version the agent last
	// registered with: informational, not signed (RegisterRequest).
	CarveVersion string `json:"carve_version,omitempty"`
}

// AgentKeys are an agent's public keys, made on its host (the private
// halves never leave it) and carried in its master-signed record, so that
// gossip can carry them but never forge them. Each is standard base64 of
// 32 bytes; empty when the agent has none.
type AgentKeys struct {
	// Claim is an ed25519 key: the agent signs its claims on address
	// space (ring entries, grants) with it, and peers accept a claim only
	// under the key in the claimer's record.
	Claim string `json:"claim,omitempty"`
	// WireGuard is a Curve25519 key: peers encrypt to the agent with it
	// when the network's encryption is on.
	WireGuard string `json:"wireguard,omitempty"`
}

// NotLeased is an overlay, or one address family of it, left out of an
// agent's record.
type NotLeased struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// HasIP tells whether the record carries an underlay IP (not NoIP).
func (a *AgentInfo) HasIP() bool { return a.IP != "" && a.IP != NoIP }

// Overlay returns the agent's overlay of that name, or nil.
func (a *AgentInfo) Overlay(name string) *AgentOverlay {
	for i := range a.Overlays {
		if a.Overlays[i].Info.Name == name {
			return &a.Overlays[i]
		}
	}
	return nil
}

// AgentOverlay is one overlay's leases for one agent.
type AgentOverlay struct {
	Info         OverlayNetwork `json:"info"`
	Subnet       string         `json:"subnet,omitempty"`
	Subnet6      string         `json:"subnet6,omitempty"`
	MesosBridge  *BridgeInfo    `json:"mesos_bridge,omitempty"`
	DockerBridge *BridgeInfo    `json:"docker_bridge,omitempty"`
	Backend      *BackendInfo   `json:"backend,omitempty"`
	State        OverlayState   `json:"state"`
	// Blocks are every CIDR block the agent holds in this overlay (a carve
	// extension): the first ones (origin lease, the halves of subnet and
	// subnet6, which stay where DC/OS consumers read them), the ones grown
	// from the masters and the ones granted by peers. Blocks of all agents
	// never overlap: a donor that granted part of a block lists the CIDR
	// decomposition of what it still holds, while its subnet and bridge
	// fields keep showing its whole first lease (routed to it; the granted
	// part is routed to the recipient by the longer prefix).
	Blocks []Block `json:"blocks,omitempty"`
}

// Origins of a block (Block.Origin).
const (
	// BlockLeased is a bridge's first sub-subnet, leased at registration.
	BlockLeased = "lease"
	// BlockGrown is an extra lease from the masters (POST .../blocks).
	BlockGrown = "grow"
	// BlockGranted was granted by a peer through the ring (Block.Donor).
	BlockGranted = "grant"
)

// Block is one CIDR-aligned block of an overlay that an agent holds for
// one of its bridges.
type Block struct {
	// Bridge is BridgeMesos or BridgeDocker.
	Bridge string `json:"bridge"`
	Prefix string `json:"prefix"`
	Origin string `json:"origin"`
	// Donor is the agent that granted the block (origin grant).
	Donor string `json:"donor,omitempty"`
	// Version is the Raft index at which the masters committed the block
	// to this agent in its present form.
	Version uint64 `json:"version"`
	// Used and Free are the addresses in use and free in the block, as the
	// agent last reported them (PUT .../usage); absent when unknown. Not
	// signed: informational.
	Used *uint64 `json:"used,omitempty"`
	Free *uint64 `json:"free,omitempty"`
}

// GrowRequest is the body of POST /overlay-master/agents/{agent_id}/blocks:
// one more block for a bridge of an overlay.
type GrowRequest struct {
	Overlay string `json:"overlay"`
	// Bridge is BridgeMesos or BridgeDocker.
	Bridge string `json:"bridge"`
	// Family is "4" or "6".
	Family    string `json:"family"`
	RequestID string `json:"request_id,omitempty"`
}

// ReturnRequest is the body of POST /overlay-master/agents/{agent_id}/blocks/return:
// the agent gives back what it holds inside Prefix (grown or granted
// blocks; never its first lease).
type ReturnRequest struct {
	Overlay   string `json:"overlay"`
	Prefix    string `json:"prefix"`
	RequestID string `json:"request_id,omitempty"`
	// Version is the version at which the returner's record listed the
	// block when it decided to give it back, and RestoreEpoch the masters'
	// restore epoch of that record (0: none yet). With them the masters
	// refuse a return that waited across a restore while the returner was
	// leased the block anew (409 conflict). Agents of v0.4 and earlier send
	// neither (Version 0) and are judged without them.
	Version      uint64 `json:"version,omitempty"`
	RestoreEpoch uint64 `json:"restore_epoch,omitempty"`
}

// GrantReport is the body of POST /overlay-master/agents/{agent_id}/blocks/grants:
// a ring grant of Prefix from Donor to Recipient, reported by either of
// them ({agent_id}), so that the masters record it.
type GrantReport struct {
	Overlay   string `json:"overlay"`
	Prefix    string `json:"prefix"`
	Donor     string `json:"donor"`
	Recipient string `json:"recipient"`
	// Bridge is the recipient's bridge the block serves; BridgeMesos when
	// empty.
	Bridge    string `json:"bridge,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Expires and DonorSignature are the donor's signed grant (grant.go):
	// required when the recipient reports it.
	Expires        int64  `json:"expires,omitempty"`
	DonorSignature string `json:"donor_signature,omitempty"`
}

// UsageReport is the body of PUT /overlay-master/agents/{agent_id}/usage:
// the used and free counts of every block the agent holds, per overlay.
// It changes no record (no new version, nothing signed); the masters show
// the counts in the blocks of the agent's record.
type UsageReport struct {
	Overlays []OverlayUsage `json:"overlays"`
	// StateIndex is the index of the masters' state the agent has merged
	// (its tombstones): with a report that lists every block the agent
	// holds, it tells the masters that the agent holds no block they do not
	// know of, from donors deleted at or before that index (see
	// docs/design.md, "Growth and the one-owner invariant"). 0: not a
	// complete report.
	StateIndex uint64 `json:"state_index,omitempty"`
}

// UsageAnswer is the masters' answer to a usage report.
type UsageAnswer struct {
	// Acknowledged is the state index up to which the masters hold the
	// agent's holdings acknowledged (0: none; the report was not complete,
	// or named blocks in Unknown).
	Acknowledged uint64 `json:"acknowledged,omitempty"`
	// Unknown are reported blocks ("overlay:prefix") the masters do not
	// know as the agent's: report those grants (ReportGrant) first.
	Unknown []string `json:"unknown,omitempty"`
}

// OverlayUsage is one overlay of a UsageReport.
type OverlayUsage struct {
	Name   string       `json:"name"`
	Blocks []BlockUsage `json:"blocks"`
}

// BlockUsage is the used and free count of one block.
type BlockUsage struct {
	Prefix string `json:"prefix"`
	Used   uint64 `json:"used"`
	Free   uint64 `json:"free"`
}

// BridgeInfo is a bridge's name and its sub-subnet.
type BridgeInfo struct {
	Name string `json:"name"`
	IP   string `json:"ip,omitempty"`
	IP6  string `json:"ip6,omitempty"`
}

// BackendInfo describes how the overlay is carried; VXLAN is the only backend.
type BackendInfo struct {
	VXLAN *VXLANInfo `json:"vxlan,omitempty"`
}

// VXLANInfo is the agent's VTEP.
type VXLANInfo struct {
	VNI      uint32 `json:"vni"`
	VTEPName string `json:"vtep_name"`
	VTEPIP   string `json:"vtep_ip"`
	VTEPMAC  string `json:"vtep_mac"`
	// VTEPIP6 is the IPv6 VTEP address with vtep_subnet6's prefix
	// (fd01:a::1/64), when vtep_subnet6 is configured.
	VTEPIP6  string `json:"vtep_ip6,omitempty"`
	VTEPPort uint16 `json:"vtep_port"`
	VTEPMTU  int    `json:"vtep_mtu,omitempty"`
}

// OverlayState is the status of an overlay for an agent; Error says why when
// failed. In the masters' records it is what the agent reported after
// configuring the overlay (STATUS_CONFIGURING until it has reported for
// its current record); the agent acts on its leases, never on it.
type OverlayState struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// Tombstone records that an agent was deleted at Raft index Version, so that
// late gossip of an older record cannot resurrect it.
type Tombstone struct {
	AgentID string `json:"agent_id"`
	Version uint64 `json:"version"`
	// Signature is the masters' ed25519 signature of TombstoneSigningBytes,
	// standard base64; absent when the masters sign nothing.
	Signature string `json:"signature,omitempty"`
}

// State is the masters' whole state, GET /overlay-master/state.
type State struct {
	Network NetworkConfig `json:"network"`
	Index   uint64        `json:"index"`
	// ClusterID names the Raft log the state comes from: it is chosen when
	// the cluster is bootstrapped and changes only when the cluster is
	// rebuilt from nothing, so an agent can tell a rebuilt cluster (a new
	// id) from a master that is merely behind (the same id, a lower index).
	ClusterID string `json:"cluster_id,omitempty"`
	Leader    string `json:"leader,omitempty"`
	// SigningKey is the public half of the masters' record-signing key
	// (EncodeSigningKey: standard base64 of the 32-byte ed25519 key); absent
	// when the masters sign nothing. Trust it only from a master whose TLS
	// certificate was verified against the cluster CA.
	SigningKey string      `json:"signing_key,omitempty"`
	Agents     []AgentInfo `json:"agents,omitempty"`
	Tombstones []Tombstone `json:"tombstones,omitempty"`
	// Horizon is the highest Raft index up to which the masters compacted
	// tombstones (0: none yet). A record or tombstone of version at or
	// below it that the state does not hold is gone for good: an agent
	// drops it, whoever gossips it.
	Horizon uint64 `json:"horizon,omitempty"`
	// Quarantine is the space of deleted agents that the masters do not
	// lease yet (a carve extension; see docs/design.md, "Growth and the
	// one-owner invariant").
	Quarantine []QuarantinedBlock `json:"quarantine,omitempty"`
	// SigningChain endorses SigningKey with the keys before it during a
	// rotation of the record-signing key (signingchain.go); nil outside one.
	SigningChain *SigningChain `json:"signing_chain,omitempty"`
	// Revoked is the masters' deny list of certificates (a carve
	// extension; see Revocation).
	Revoked []Revocation `json:"revoked,omitempty"`
	// Restore, when the table was restored from a snapshot, is that event,
	// signed (restore.go): agents compare its epoch before the index.
	Restore *Restore `json:"restore,omitempty"`
}

// Changes is GET /overlay-master/changes?since=N: what changed in the
// masters' state after index Since, up to Index. Agents and Tombstones are
// the records and tombstones whose version is above Since (signed as in the
// State); Network is set only when the configuration changed after Since
// (then every record is in Agents, re-rendered). ClusterID, SigningKey and
// Horizon are always set (they are small), so a client can tell a rebuilt
// cluster, a new key or a compaction from one answer.
type Changes struct {
	Index      uint64         `json:"index"`
	Since      uint64         `json:"since"`
	ClusterID  string         `json:"cluster_id,omitempty"`
	SigningKey string         `json:"signing_key,omitempty"`
	Horizon    uint64         `json:"horizon,omitempty"`
	Network    *NetworkConfig `json:"network,omitempty"`
	Agents     []AgentInfo    `json:"agents,omitempty"`
	Tombstones []Tombstone    `json:"tombstones,omitempty"`

	// SigningChain is State.SigningChain, always set during a rotation.
	SigningChain *SigningChain `json:"signing_chain,omitempty"`
	// Revoked is the whole deny list, in every answer (it is small).
	Revoked []Revocation `json:"revoked,omitempty"`
	// Restore is State.Restore (always set when there was one).
	Restore *Restore `json:"restore,omitempty"`
}

// QuarantinedBlock is a block of a deleted agent's space that is not
// leasable until every live agent has acknowledged its holdings.
type QuarantinedBlock struct {
	Overlay string `json:"overlay"`
	Prefix  string `json:"prefix"`
	// From is the deleted agent, Since the Raft index of its deletion.
	From  string `json:"from"`
	Since uint64 `json:"since"`
}

// DeleteAgentsRequest is the DC/OS bulk delete body: agent ids or underlay IPs.
type DeleteAgentsRequest struct {
	Agents    []string `json:"agents"`
	RequestID string   `json:"request_id,omitempty"`
}

// Error is the body of every error answer.
type Error struct {
	Message string `json:"error"`
	Code    string `json:"code"`
	// Oldest, on a 410 of GET /overlay-master/changes (CodeGone), is the
	// oldest index the masters can serve changes since.
	Oldest uint64 `json:"oldest,omitempty"`
	// SigningKey, on a 403 of a registration (CodeWireGuardProof), is the
	// record-signing key (wire form) of the master that refused: a
	// WireGuard proof made against it is the one that master checks.
	SigningKey string `json:"signing_key,omitempty"`
	// Status is the HTTP status it came with (not on the wire).
	Status int `json:"-"`
	// Also are the failures of the other masters a call tried, each
	// naming its master (not on the wire: apiclient's failover sets it).
	Also []string `json:"-"`
	// cause is what made a call fail without an answer (wraps ErrUnreachable).
	cause error
}

// Unwrap returns the transport failure behind an error without an answer.
func (e *Error) Unwrap() error { return e.cause }

// Error is the message, with the code and status of an answer (a call
// that got none says why in its message: no code to add), then the other
// masters' failures.
func (e *Error) Error() string {
	msg := "carve: " + e.Message
	switch {
	case e.Status != 0:
		msg += " (" + e.Code + ", HTTP " + strconv.Itoa(e.Status) + ")"
	case e.cause == nil && e.Code != "":
		msg += " (" + e.Code + ")"
	}
	if len(e.Also) > 0 {
		msg += "; also " + strings.Join(e.Also, "; ")
	}
	return msg
}

// ServerInfo is one Raft server as /cluster/status shows it.
type ServerInfo struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr,omitempty"`
	// URL is the master's API base URL: https://HTTP_ADDR when the masters
	// serve TLS, http://HTTP_ADDR when they run --insecure.
	URL   string `json:"url,omitempty"`
	Voter bool   `json:"voter"`
}

// BuildInfo is a build of carve (carve version).
type BuildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	GoVersion string `json:"go_version"`
	BuildDate string `json:"build_date,omitempty"`
}

// JoinRequest is POST /cluster/join: add a master as a voter.
type JoinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr,omitempty"`
}
