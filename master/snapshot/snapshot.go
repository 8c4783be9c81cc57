// Package snapshot is the lease table's snapshot format: what a Raft
// snapshot of the masters and a `carve snapshot save` file hold (Data),
// its versions and which of them this master reads, and its writing. The
// JSON tags of its types, and of the record types they carry
// (master/record), are the format: a master of the next release restores
// them, so they change only with a new Format that still reads the old
// ones. It decides nothing: master/state turns a snapshot into its table
// and checks what a restore needs. It imports nothing of ours but api,
// master/record and master/logcmd (a master's addresses).
package snapshot

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/record"
)

// Versions of the snapshot encoding. Format 3 added the IPv6 VTEP
// addresses, the agents' configuration reports, the blocks of every lease,
// the records' creation index and the quarantine; format 2 added the
// cluster id and the outcomes of requests. Format 1 and 2 snapshots still
// restore: without reports (every overlay shows STATUS_CONFIGURING until
// its agent reports), and their records get the lease blocks of their
// subnets.
const (
	// Format is the version this master writes.
	Format = 3
	// FormatBlocks is the first version whose records hold their blocks.
	FormatBlocks = 3
	// FormatLegacy is the oldest version this master reads.
	FormatLegacy = 1
)

// Data is a snapshot of the lease table.
type Data struct {
	Format     int                          `json:"format"`
	Index      uint64                       `json:"index"`
	StateIndex uint64                       `json:"state_index"`
	ClusterID  string                       `json:"cluster_id,omitempty"`
	Network    *api.NetworkConfig           `json:"network,omitempty"`
	Agents     []Agent                      `json:"agents"`
	Tombstones map[string]uint64            `json:"tombstones"`
	Servers    map[string]logcmd.ServerMeta `json:"servers"`
	Requests   []Request                    `json:"requests"`
	Reports    map[string]record.Report     `json:"reports,omitempty"`
	Quarantine map[string][]Quarantined     `json:"quarantine,omitempty"`
	// Horizon and Marks are the tombstone compaction's.
	Horizon uint64      `json:"horizon,omitempty"`
	Marks   []ClockMark `json:"marks,omitempty"`
	// Revoked is the deny list of certificates.
	Revoked []api.Revocation `json:"revoked,omitempty"`
	// Restore is the last restore from a snapshot, unsigned.
	Restore *api.Restore `json:"restore,omitempty"`
	// UsedStatements are the grant statements that moved space, with
	// their expiry.
	UsedStatements map[string]int64 `json:"used_statements,omitempty"`
	// History names the Raft log the table was applied from, when a
	// whole-cluster restore started it ("": the cluster id).
	History string `json:"history,omitempty"`
}

// Agent is an agent's record in a snapshot.
type Agent struct {
	ID       string                  `json:"id"`
	Hostname string                  `json:"hostname,omitempty"`
	IP       netip.Addr              `json:"ip,omitzero"`
	MeshAddr string                  `json:"mesh_addr,omitempty"`
	Bridges  api.AgentNetworkConfig  `json:"bridges"`
	Keys     api.AgentKeys           `json:"keys,omitzero"`
	MTU      int                     `json:"underlay_mtu,omitempty"`
	VTEP     netip.Addr              `json:"vtep"`
	VTEP6    netip.Addr              `json:"vtep6,omitzero"`
	Leases   map[string]record.Lease `json:"leases"`
	Version  uint64                  `json:"version"`
	Created  uint64                  `json:"created,omitempty"`
	// CarveVersion is the agent's carve version (informational).
	CarveVersion string `json:"carve_version,omitempty"`
}

// Request is one remembered request. A registration's outcome is usually
// the agent's current record, named by CurrentAgent; only a record
// replaced since is written out in Agent.
type Request struct {
	ID           string   `json:"id"`
	Index        uint64   `json:"index"`
	Op           string   `json:"op,omitempty"`
	Digest       string   `json:"digest,omitempty"`
	CurrentAgent string   `json:"current_agent,omitempty"`
	Agent        *Agent   `json:"agent,omitempty"`
	Deleted      []string `json:"deleted,omitempty"`
}

// Quarantined is space of a deleted agent that is not leasable yet.
type Quarantined struct {
	Prefix netip.Prefix `json:"prefix"`
	From   string       `json:"from"`  // the deleted agent
	Since  uint64       `json:"since"` // the deletion's Raft index
	// Bridge is the bridge the block served (empty in snapshots written
	// before it was kept: the mesos bridge).
	Bridge string `json:"bridge,omitempty"`
	// ClaimKey is the deleted agent's claim key (api.AgentKeys.Claim),
	// kept with its quarantined space: a grant it made before its
	// deletion is reported by its recipient under its signature, which
	// the masters verify with this key (empty in snapshots written before
	// it was kept).
	ClaimKey string `json:"claim_key,omitempty"`
}

// ClockMark ties a Raft index to the leader's clock when it was applied.
type ClockMark struct {
	Index uint64 `json:"index"`
	Time  int64  `json:"time"`
}

// AgentOf is r as a snapshot holds it.
func AgentOf(r *record.Agent) Agent {
	return Agent{ID: r.ID, Hostname: r.Hostname, IP: r.IP, MeshAddr: r.MeshAddr,
		Bridges: r.Bridges, Keys: r.Keys, MTU: r.UnderlayMTU, VTEP: r.VTEP, VTEP6: r.VTEP6, Leases: r.Leases, Version: r.Version, Created: r.Created,
		CarveVersion: r.CarveVersion}
}

// Record is the record a snapshot's agent holds (its leases a new map when
// the snapshot had none).
func (a Agent) Record() *record.Agent {
	rec := &record.Agent{ID: a.ID, Hostname: a.Hostname, IP: a.IP, MeshAddr: a.MeshAddr,
		Bridges: a.Bridges, Keys: a.Keys, UnderlayMTU: a.MTU, VTEP: a.VTEP, VTEP6: a.VTEP6, Leases: a.Leases, Version: a.Version, Created: a.Created,
		CarveVersion: a.CarveVersion}
	if rec.Leases == nil {
		rec.Leases = map[string]record.Lease{}
	}
	return rec
}

// CheckFormat refuses a snapshot of a version this master does not read.
func (d *Data) CheckFormat() error {
	if d.Format < FormatLegacy || d.Format > Format {
		return fmt.Errorf("lease table snapshot format %d, this master reads %d to %d", d.Format, FormatLegacy, Format)
	}
	return nil
}

// Write writes d as JSON, one line, and tells how many bytes it wrote.
func Write(w io.Writer, d *Data) (int64, error) {
	cw := &countingWriter{w: w}
	if err := json.NewEncoder(cw).Encode(d); err != nil {
		return cw.n, fmt.Errorf("write lease table snapshot: %w", err)
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
