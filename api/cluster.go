package api

import (
	"crypto/sha256"
	"encoding/hex"
)

// ClusterStatus is GET /cluster/status: this node's view of the Raft cluster.
type ClusterStatus struct {
	ID                string       `json:"id"`
	Role              string       `json:"role"`
	Leader            *ServerInfo  `json:"leader,omitempty"`
	Servers           []ServerInfo `json:"servers"`
	Term              uint64       `json:"term"`
	CommitIndex       uint64       `json:"commit_index"`
	AppliedIndex      uint64       `json:"applied_index"`
	LastIndex         uint64       `json:"last_index"`
	LastSnapshotIndex uint64       `json:"last_snapshot_index"`
	// ClusterID is the id in State.ClusterID ("" until the first leader
	// committed it).
	ClusterID string `json:"cluster_id,omitempty"`
	// CaughtUp tells whether this master has applied what the cluster had
	// committed when it first heard from a leader after it started; until
	// then it answers state reads with 503.
	CaughtUp bool `json:"caught_up"`
	// Build is this master's build (carve version); absent from masters
	// of earlier versions.
	Build *BuildInfo `json:"build,omitempty"`
	// AgentVersions counts the agents of this master's table by the carve
	// version they registered with ("unknown": agents of earlier versions,
	// which send none).
	AgentVersions map[string]int `json:"agent_versions,omitempty"`
	// SilentAgents, on the leader, are the agents not heard from (no
	// watch, report or usage report) for longer than SilentAfter (a Go
	// duration); followers judge none.
	SilentAgents []SilentAgent `json:"silent_agents,omitempty"`
	SilentAfter  string        `json:"silent_after,omitempty"`
	// StateDigests are this master's recent digests of its replicated
	// state, oldest first, each at the Raft index it was taken (one per
	// stretch of 1,024 indexes): masters that hold different digests at
	// the same index hold different states, which a replicated state
	// machine never may. Absent from masters of earlier versions.
	StateDigests []StateDigest `json:"state_digests,omitempty"`
	// ConfigDiffers says how this master's --config file differs from the
	// committed network configuration ("": it does not). The file is only
	// the value a new cluster starts with; carve config apply changes the
	// committed one.
	ConfigDiffers string `json:"config_differs,omitempty"`
	// ExhaustedOverlays are the overlays that cannot give an agent a
	// subnet, or a container an address (LeaseTable.Exhausted).
	ExhaustedOverlays []ExhaustedOverlay `json:"exhausted_overlays,omitempty"`
	// DataDirError says why this master cannot write its data dir (a
	// full or read-only disk: its Raft log cannot grow), as its last
	// probe found ("": it can). Absent from masters of earlier versions.
	DataDirError string `json:"data_dir_error,omitempty"`
	// CertificateCA is the CA that issued this master's certificate (the
	// one it serves the API and Raft with), by CAFingerprint; "" without
	// TLS, or when its certificate does not verify against its CA file.
	// carve certs check-ca compares it with a CA rotation's new CA.
	CertificateCA string `json:"certificate_ca,omitempty"`
	// SigningKey is the key this master signs records with
	// (EncodeSigningKey); absent when it signs nothing or predates it.
	SigningKey string `json:"signing_key,omitempty"`
	// AgentTrust, on the leader, is what the live agents' reports say of
	// the masters' records; followers judge none.
	AgentTrust *AgentTrust `json:"agent_trust,omitempty"`
	// History names the Raft log this master's state belongs to: the
	// cluster id, and after a whole-cluster restore the cluster id and
	// that restore's epoch ("<cluster id>/<epoch>"). Masters of different
	// histories never exchange log entries or votes (their Raft transport
	// refuses each other); a master of an older one runs on a data
	// directory from before a restore. Absent until the cluster id is
	// committed, and from masters of earlier versions.
	History string `json:"history,omitempty"`
	// HistoryConflict says which Raft peer this master refused (or was
	// refused by) for being of another history in the last minutes, and
	// what to do ("": none).
	HistoryConflict string `json:"history_conflict,omitempty"`
}

// ExhaustedOverlay is an enabled overlay, in one address family, that
// cannot give an agent or a container what it asks for
// (ClusterStatus.ExhaustedOverlays).
type ExhaustedOverlay struct {
	Overlay string `json:"overlay"`
	// Family is 4 or 6.
	Family int `json:"family"`
	// UnleasedCount agents have no subnet of it: every subnet is leased;
	// Unleased names the first ten of them.
	UnleasedCount int      `json:"unleased_count,omitempty"`
	Unleased      []string `json:"unleased,omitempty"`
	// Full: no block is left to grow into, and every agent holding space
	// in it reported no free address (judged by the leader, which receives
	// the usage reports). Free is what they reported free.
	Full bool   `json:"full,omitempty"`
	Free uint64 `json:"free,omitempty"`
}

// MaxAgentTrustListed bounds each list of AgentTrust; the counts are whole.
const MaxAgentTrustListed = 100

// AgentTrust is, over the live agents (not silent), those that report
// verifying with another key than the masters' (or none), those that
// refuse the masters' records, and those whose kernel holds fewer peers
// than the masters' records give them. Each list is sorted by agent id
// and holds at most MaxAgentTrustListed agents; its count is whole.
type AgentTrust struct {
	OtherKey      []AgentKey      `json:"other_key,omitempty"`
	OtherKeyCount int             `json:"other_key_count,omitempty"`
	Refusing      []AgentRefusing `json:"refusing,omitempty"`
	RefusingCount int             `json:"refusing_count,omitempty"`
	FewPeers      []AgentFewPeers `json:"few_peers,omitempty"`
	FewPeersCount int             `json:"few_peers_count,omitempty"`
	// ByCA are the live agents by the CA that issued the certificate they
	// present to the masters (the newest one the leader saw; a follower
	// passes on, with the writes it forwards, the certificate of the agent
	// that sent them), sorted by CA; empty when the masters run without
	// TLS. What a CA rotation's last step checks (carve certs check-ca).
	ByCA []AgentCA `json:"by_ca,omitempty"`
	// ByMesh are the live agents by the mesh passwords they report
	// (ReportRequest.MeshPassword and MeshAccepted), sorted by the pair;
	// empty when none reports one. What each round of a mesh password
	// change checks (carve certs check-mesh).
	ByMesh []AgentMesh `json:"by_mesh,omitempty"`
}

// AgentMesh is a pair of mesh password fingerprints
// (MeshPasswordFingerprint: the one sent, the one accepted besides; ""
// for none, or not reported yet) and the live agents that report it.
// Agents holds at most MaxAgentTrustListed of them, sorted; Count is
// whole.
type AgentMesh struct {
	Password string   `json:"password,omitempty"`
	Accepted string   `json:"accepted,omitempty"`
	Count    int      `json:"count"`
	Agents   []string `json:"agents,omitempty"`
}

// AgentCA is a CA and the live agents whose certificate it issued. CA is
// CAFingerprint of the issuing CA certificate, or "" for agents whose
// certificate the leader has not seen yet (they send it a usage report
// at least every minute). Agents holds at most MaxAgentTrustListed of
// them, sorted; Count is whole.
type AgentCA struct {
	CA     string   `json:"ca"`
	Count  int      `json:"count"`
	Agents []string `json:"agents,omitempty"`
}

// CAFingerprint names a CA certificate, given its DER SubjectPublicKeyInfo
// (x509.Certificate.RawSubjectPublicKeyInfo): the SHA-256 of it, hex. A CA
// re-issued with the same key keeps its name, as it keeps verifying the
// certificates it issued.
func CAFingerprint(spki []byte) string {
	sum := sha256.Sum256(spki)
	return hex.EncodeToString(sum[:])
}

// AgentKey is an agent and the signing key it last reported ("": none, an
// agent that predates the report of it or has not reported yet).
type AgentKey struct {
	AgentID    string `json:"agent_id"`
	SigningKey string `json:"signing_key,omitempty"`
}

// AgentRefusing is an agent that reports refusing the masters' records, and why.
type AgentRefusing struct {
	AgentID string `json:"agent_id"`
	Reason  string `json:"reason"`
}

// AgentFewPeers is an agent whose kernel holds fewer peers (Programmed) than
// the masters' records at Index give it (Expected: the live agents leased
// in one of its enabled overlays, but itself).
type AgentFewPeers struct {
	AgentID    string `json:"agent_id"`
	Programmed int    `json:"programmed"`
	Expected   int    `json:"expected"`
	Index      uint64 `json:"index"`
}

// StateDigest is a SHA-256 of a master's whole replicated state as applied
// up to Index (hex).
type StateDigest struct {
	Index  uint64 `json:"index"`
	Digest string `json:"digest"`
}

// SilentPrefix starts the error of the overlays of an agent the leader
// has not heard from (their status shows STATUS_FAILED).
const SilentPrefix = "agent silent: "

// SilentAgent is an agent the leader has not heard from for longer than
// ClusterStatus.SilentAfter.
type SilentAgent struct {
	AgentID string `json:"agent_id"`
	// LastHeard is when it was last heard from (RFC 3339); absent when not
	// since this master leads.
	LastHeard string `json:"last_heard,omitempty"`
}
