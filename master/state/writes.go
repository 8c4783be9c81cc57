package state

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
)

// The commands the masters propose, each built from its request. A
// constructor that takes an API request validates it first and names the
// bad field and how to fix it: the server answers that error 400.

// Command is one entry for the Raft log, made by the constructors below:
// what a write asks the table to do. Apply decodes what Encode gives.
type Command struct{ c command }

// Encode is the command as a Raft log entry.
func (c Command) Encode() ([]byte, error) { return encodeCommand(c.c) }

// RegisterCommand registers (or updates) an agent, after
// ValidateRegistration.
func RegisterCommand(req api.RegisterRequest) (Command, error) {
	if err := ValidateRegistration(&req); err != nil {
		return Command{}, err
	}
	return Command{command{Op: opRegister, RequestID: req.RequestID, Register: &registerCmd{
		AgentID: req.AgentID, Hostname: req.Hostname, IP: req.IP, MeshAddr: req.MeshAddr, Bridges: req.NetworkConfig,
		Keys: req.Keys, UnderlayMTU: req.UnderlayMTU, CarveVersion: req.CarveVersion,
	}}}, nil
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
	return Command{command{Op: opReport, RequestID: requestID, Report: &reportCmd{AgentID: agentID, Report: req}}}, nil
}

// DeleteAgentCommand deletes one agent by id or underlay IP; applying it
// fails with ErrUnknownAgent for a name neither known nor deleted before.
func DeleteAgentCommand(name string) Command {
	return Command{command{Op: opDelete, Delete: &deleteCmd{Agents: []string{name}, Strict: true}}}
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
	return Command{command{Op: opDelete, RequestID: req.RequestID, Delete: &deleteCmd{Agents: req.Agents}}}, nil
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
	return Command{command{Op: opGrow, RequestID: req.RequestID, Grow: &growCmd{AgentID: agentID, Overlay: req.Overlay, Bridge: req.Bridge, Family: family}}}, nil
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
	return Command{command{Op: opReturn, RequestID: req.RequestID, Return: &returnCmd{AgentID: agentID, Overlay: req.Overlay, Prefix: p}}}, nil
}

// GrantCommand records a ring grant that reporter (its donor or its
// recipient) reports.
func GrantCommand(reporter string, req api.GrantReport) (Command, error) {
	if err := validateGrantReport(reporter, &req); err != nil {
		return Command{}, err
	}
	p, _ := parseBlockPrefix("prefix", req.Prefix) // validated
	g := &grantCmd{Overlay: req.Overlay, Prefix: p, Donor: req.Donor, Recipient: req.Recipient, Bridge: req.Bridge}
	if req.DonorSignature != "" {
		g.Statement, g.Expires = StatementID(req.DonorSignature), req.Expires
	}
	return Command{command{Op: opGrant, RequestID: req.RequestID, Grant: g}}, nil
}

// StatementID names a donor's signed grant statement: the SHA-256 of its
// signature (hex). The masters keep the ids of the statements that moved
// space until they expire (usedStatements).
func StatementID(signature string) string {
	sum := sha256.Sum256([]byte(signature))
	return hex.EncodeToString(sum[:])
}

// SetConfigCommand merges a network configuration into the committed one
// (see mergeConfig); the leader proposes its file's.
func SetConfigCommand(cfg api.NetworkConfig) Command {
	return Command{command{Op: opSetConfig, SetConfig: &cfg}}
}

// ServerMetaCommand records a master's addresses.
func ServerMetaCommand(meta ServerMeta) Command {
	return Command{command{Op: opServerMeta, ServerMeta: &meta}}
}

// ClusterIDCommand commits the cluster id, unless one is committed already.
func ClusterIDCommand(id string) Command {
	return Command{command{Op: opSetClusterID, ClusterID: id}}
}

// CompactCommand drops the tombstones older than maxAge (at least a
// millisecond) by the leader's clock now.
func CompactCommand(now time.Time, maxAge time.Duration) Command {
	return Command{command{Op: opCompact, Compact: &compactCmd{Now: now.UnixMilli(), MaxAge: max(maxAge.Milliseconds(), 1)}}}
}
