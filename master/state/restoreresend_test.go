package state

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

// The tests of this file compose two mechanisms: the masters' memory of
// request outcomes (a retry after a lost answer has one effect) and the
// restore of the table from a snapshot (which forgets the outcomes and the
// effects of the requests applied after the snapshot). An agent's report
// (a ring grant with its donor's statement, a return) sent again after a
// restore, its request id no longer known, must never move space another
// agent holds, nor let one statement move space twice.

// resendLog applies one log to two replicas, as two masters would: the
// first applies every entry; the second too, and is now and then replaced
// by a restore of the first one's Raft snapshot (a follower sent the
// leader's snapshot). After every entry both hold the same state (digest,
// answers, used statements) and the table's invariants.
type resendLog struct {
	t      *testing.T
	tables [2]*LeaseTable
	index  uint64
	epoch  int64 // the clock restores take their epoch from
}

// statementExpiry is when the statements of these tests expire (Unix
// seconds): never within a test.
const statementExpiry = 4102444800

func newResendLog(t *testing.T) *resendLog {
	t.Helper()
	l := &resendLog{t: t, tables: [2]*LeaseTable{NewLeaseTable(), NewLeaseTable()}, epoch: 100}
	cfg := growCfg()
	l.mustApply(command{Op: opSetClusterID, ClusterID: "c1"})
	l.mustApply(command{Op: opSetConfig, SetConfig: &cfg})
	return l
}

// apply appends c to the log, applies it on both replicas and checks them.
func (l *resendLog) apply(c command) Result {
	l.t.Helper()
	data, err := c.Encode()
	if err != nil {
		l.t.Fatal(err)
	}
	l.index++
	var res [2]Result
	for i, tb := range l.tables {
		res[i] = tb.Apply(l.index, data).(Result)
	}
	if !jsonEqual(res[0], res[1]) || fmt.Sprint(res[0].Err) != fmt.Sprint(res[1].Err) {
		l.t.Fatalf("index %d (%s) answered differently on two replicas:\n%+v\n%+v", l.index, c.Op, res[0], res[1])
	}
	l.check()
	return res[0]
}

func (l *resendLog) mustApply(c command) Result {
	l.t.Helper()
	res := l.apply(c)
	if res.Err != nil {
		l.t.Fatalf("%s %s: %v", c.Op, c.RequestID, res.Err)
	}
	return res
}

// check: both replicas hold the table's invariants (no block held by two
// agents, nor by an agent and the quarantine; the allocators exactly the
// records) and the same state, the used statements (not in the digest)
// included.
func (l *resendLog) check() {
	l.t.Helper()
	for i, tb := range l.tables {
		if err := tb.CheckInvariants(); err != nil {
			l.t.Fatalf("replica %d at index %d: %v", i, l.index, err)
		}
	}
	_, d0 := l.tables[0].StateDigest()
	_, d1 := l.tables[1].StateDigest()
	if d0 != d1 {
		l.t.Fatalf("at index %d the replicas' states differ: %.12s, %.12s", l.index, d0, d1)
	}
	if !maps.Equal(l.tables[0].usedStatements, l.tables[1].usedStatements) {
		l.t.Fatalf("at index %d the replicas' used statements differ: %v, %v", l.index, l.tables[0].usedStatements, l.tables[1].usedStatements)
	}
}

// catchUp replaces the second replica by a restore of the first one's Raft
// snapshot.
func (l *resendLog) catchUp() {
	l.t.Helper()
	at, b := raftSnapshot(l.t, l.tables[0])
	tb := NewLeaseTable()
	if err := tb.Restore(at, bytes.NewReader(b)); err != nil {
		l.t.Fatalf("restore of the Raft snapshot at %d: %v", at, err)
	}
	l.tables[1] = tb
	l.check()
}

// save is the table as carve snapshot save writes it.
func (l *resendLog) save() []byte {
	l.t.Helper()
	var buf bytes.Buffer
	if err := l.tables[0].WriteSnapshot(&buf); err != nil {
		l.t.Fatal(err)
	}
	return buf.Bytes()
}

// restore commits a restore of snap (carve snapshot restore) in the log.
func (l *resendLog) restore(snap []byte) {
	l.t.Helper()
	l.epoch++
	l.mustApply(logcmd.RestoreCommand(snap, time.Unix(0, l.epoch)))
}

// restoreAsBuiltBefore commits a restore of snap as masters built before
// the keep_live field proposed it: it takes back from the agents it keeps
// what they were leased after the snapshot. Masters replaying a log with
// such an entry apply it so, and the statements and returns resent after
// it must still be judged safely.
func (l *resendLog) restoreAsBuiltBefore(snap []byte) {
	l.t.Helper()
	l.epoch++
	l.mustApply(command{Op: opRestore, Restore: &restoreCmd{Epoch: uint64(l.epoch), Snapshot: snap, Quarantine: true}})
}

// restoreWholeCluster starts a new log on empty replicas whose first
// command restores snap (carve master --restore-from).
func (l *resendLog) restoreWholeCluster(snap []byte) {
	l.t.Helper()
	l.tables = [2]*LeaseTable{NewLeaseTable(), NewLeaseTable()}
	l.index = 0
	l.restore(snap)
}

// resend applies a report sent again and checks its outcome: want nil, it
// applied; else it was refused with want and changed nothing.
func (l *resendLog) resend(c command, want error) Result {
	l.t.Helper()
	_, before := l.tables[0].StateDigest()
	used := maps.Clone(l.tables[0].usedStatements)
	res := l.apply(c)
	if want == nil {
		if res.Err != nil {
			l.t.Fatalf("resent %s %s: %v, want it applied", c.Op, c.RequestID, res.Err)
		}
		return res
	}
	if !errors.Is(res.Err, want) {
		l.t.Fatalf("resent %s %s: %v, want it refused with %q", c.Op, c.RequestID, res.Err, want)
	}
	if _, after := l.tables[0].StateDigest(); after != before || !maps.Equal(used, l.tables[0].usedStatements) {
		l.t.Fatalf("the refused resend %s %s (%v) changed the state", c.Op, c.RequestID, res.Err)
	}
	return res
}

// replay applies a report sent again whose request id the masters still
// know: answered with the first answer, the state unchanged.
func (l *resendLog) replay(c command, first Result) {
	l.t.Helper()
	_, before := l.tables[0].StateDigest()
	res := l.apply(c)
	if res.Err != nil || !jsonEqual(res.Agent, first.Agent) {
		l.t.Fatalf("retry of %s %s: %+v %v, want the first answer %+v", c.Op, c.RequestID, res.Agent, res.Err, first.Agent)
	}
	if _, after := l.tables[0].StateDigest(); after != before {
		l.t.Fatalf("the retry of %s %s changed the state", c.Op, c.RequestID)
	}
}

// holders names who holds a block overlapping p at the masters: agent
// ids, and "quarantine:<id>" for a deleted agent's quarantined space.
func (l *resendLog) holders(p string) []string {
	l.t.Helper()
	pp := netip.MustParsePrefix(p)
	tb := l.tables[0]
	var out []string
	for id, rec := range tb.agents {
		for _, b := range rec.Leases["g"].Blocks {
			if b.Prefix.Overlaps(pp) && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	for _, q := range tb.quarantine["g"] {
		if q.Prefix.Overlaps(pp) && !slices.Contains(out, "quarantine:"+q.From) {
			out = append(out, "quarantine:"+q.From)
		}
	}
	slices.Sort(out)
	return out
}

// wantHolders fails unless exactly these hold space overlapping p.
func (l *resendLog) wantHolders(p string, want ...string) {
	l.t.Helper()
	if got := l.holders(p); !slices.Equal(got, want) {
		l.t.Fatalf("%s is held by %v, want %v", p, got, want)
	}
}

func (l *resendLog) register(ids ...string) {
	l.t.Helper()
	for _, id := range ids {
		l.mustApply(command{Op: opRegister, Register: &registerCmd{AgentID: id, IP: agentIP(id), Hostname: id + ".example",
			Bridges: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}}})
	}
}

// agentIP is a distinct underlay address per agent id.
func agentIP(id string) string {
	var n byte
	for _, c := range id {
		n = n*31 + byte(c)
	}
	return netip.AddrFrom4([4]byte{198, 18, 1, n}).String()
}

// deleteAndRelease deletes id and releases its quarantined space, as once
// every live agent acknowledged its holdings.
func (l *resendLog) deleteAndRelease(id string) {
	l.t.Helper()
	l.mustApply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{id}}})
	if res := l.mustApply(command{Op: opRelease, Release: &releaseCmd{Acks: l.acks()}}); res.Released == 0 {
		l.t.Fatalf("releasing %s's quarantine freed nothing", id)
	}
}

// acks are every live agent's holdings acknowledgements at the current
// index.
func (l *resendLog) acks() map[string]holdingsAck {
	acks := map[string]holdingsAck{}
	for a, rec := range l.tables[0].agents {
		acks[a] = holdingsAck{Created: rec.Created, Index: l.index}
	}
	return acks
}

// grantReport is a ring grant of prefix from donor to recip, reported with
// the donor's statement sig (none: reported by the donor itself).
func grantReport(requestID, donor, recip, prefix, sig string) command {
	g := &grantCmd{Overlay: "g", Prefix: netip.MustParsePrefix(prefix), Donor: donor, Recipient: recip, Bridge: api.BridgeMesos}
	if sig != "" {
		g.Statement, g.Expires = logcmd.StatementID(sig), statementExpiry
	}
	return command{Op: opGrant, RequestID: requestID, Grant: g}
}

func returnReport(requestID, id, prefix string) command {
	return command{Op: opReturn, RequestID: requestID, Return: &returnCmd{AgentID: id, Overlay: "g", Prefix: netip.MustParsePrefix(prefix)}}
}

func growRequest(requestID, id string) command {
	return command{Op: opGrow, RequestID: requestID, Grow: &growCmd{AgentID: id, Overlay: "g", Bridge: api.BridgeMesos, Family: 4}}
}

// In growCfg the first three agents registered lease 10.9.0.0/24,
// 10.9.1.0/24 and 10.9.2.0/24 in that order (d first, where it takes
// part); the first grow after them takes 10.9.3.0/25.
const (
	grantedP = "10.9.0.64/26" // inside d's first lease
	grownP   = "10.9.3.0/25"
)

// resendCase is one history on a resendLog, named.
type resendCase struct {
	name string
	run  func(l *resendLog)
}

// runResendCases runs each case on a log of its own, and checks at its end
// that a replica caught up from a Raft snapshot agrees.
func runResendCases(t *testing.T, cases []resendCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newResendLog(t)
			c.run(l)
			l.catchUp()
		})
	}
}

// TestReportResentAfterRestore: a report applied after a snapshot, the
// table restored to that snapshot, the report sent again with the same
// request id (which the restore forgot). Whatever the restored table did
// with the space meanwhile, the resend never moves space another agent
// holds, a statement moves space once, and both replicas agree after
// every step. The restores that give a grant back to its donor are
// entries as built before keep_live (a restore now keeps a live
// recipient's grant): replayed, they must stay safe.
func TestReportResentAfterRestore(t *testing.T) {
	runResendCases(t, []resendCase{
		{"grant resent after the restored donor granted the space to b", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			g := grantReport("r1", "d", "a", grantedP, "sig-1")
			l.mustApply(g)
			l.wantHolders(grantedP, "a")
			l.restoreAsBuiltBefore(snap)
			l.wantHolders(grantedP, "d")
			l.mustApply(grantReport("r2", "d", "b", grantedP, "sig-2"))
			l.resend(g, ErrStatementUsed)
			l.wantHolders(grantedP, "b")
		}},
		{"grant reported by its donor resent after the space went to b", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			g := grantReport("r1", "d", "a", grantedP, "") // no statement: the donor reported it
			l.mustApply(g)
			l.restoreAsBuiltBefore(snap)
			l.mustApply(grantReport("r2", "d", "b", grantedP, "sig-2"))
			l.resend(g, ErrBlockConflict)
			l.wantHolders(grantedP, "b")
		}},
		{"grant resent after the restored donor was deleted and b leased its space", func(l *resendLog) {
			l.register("d", "a")
			snap := l.save()
			g := grantReport("r1", "d", "a", grantedP, "sig-1")
			l.mustApply(g)
			l.restoreAsBuiltBefore(snap)
			l.deleteAndRelease("d")
			l.register("b") // first fit: d's old slice
			l.wantHolders(grantedP, "b")
			l.resend(g, ErrStatementUsed)
			l.wantHolders(grantedP, "b")
		}},
		{"grant resent after a restore that kept it: already the recipient's", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			g := grantReport("r1", "d", "a", grantedP, "sig-1")
			l.mustApply(g)
			l.restore(snap)
			l.wantHolders(grantedP, "a")
			l.resend(g, nil)
			l.resend(grantReport("r2", "d", "b", grantedP, "sig-2"), ErrBlockConflict) // d holds it no more
			l.wantHolders(grantedP, "a")
		}},
		{"return resent after a restore to before the grow, b grew into the space", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			ret := returnReport("r1", "a", grownP)
			l.mustApply(ret)
			l.restore(snap)
			l.wantHolders(grownP)
			l.mustApply(growRequest("r2", "b"))
			l.wantHolders(grownP, "b")
			l.resend(ret, ErrBlockConflict)
			l.wantHolders(grownP, "b")
		}},
		{"return of a granted block resent after the restored donor granted it to b", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			g := grantReport("r1", "d", "a", grantedP, "sig-1")
			l.mustApply(g)
			ret := returnReport("r2", "a", grantedP)
			l.mustApply(ret) // back to its donor
			l.wantHolders(grantedP, "d")
			l.restore(snap)
			l.mustApply(grantReport("r3", "d", "b", grantedP, "sig-3"))
			l.resend(ret, ErrBlockConflict)
			l.resend(g, ErrStatementUsed)
			l.wantHolders(grantedP, "b")
		}},
		{"return resent after a restore to after the grow applies once", func(l *resendLog) {
			l.register("a", "b", "c")
			l.mustApply(growRequest("r0", "a"))
			snap := l.save()
			ret := returnReport("r1", "a", grownP)
			l.mustApply(ret)
			l.restore(snap)
			l.wantHolders(grownP, "a") // the restore took the return back
			first := l.resend(ret, nil)
			l.wantHolders(grownP)
			l.mustApply(growRequest("r2", "b"))
			l.replay(ret, first)
			l.wantHolders(grownP, "b")
		}},
	})
}

// TestStatementResentAcrossRestore: a restore between a statement's use
// and its resend. A restore in the running cluster keeps the grant its
// recipient's (keep_live). One as built before keep_live takes the grant
// back, but not the memory of the statement: sent again, under its request
// id or a new one, it is refused and the space stays its donor's. A whole-cluster restore
// (--restore-from) knows only the statements of its snapshot: one used
// after the snapshot is recorded again while its donor still holds the
// space, and refused once another agent does.
func TestStatementResentAcrossRestore(t *testing.T) {
	t.Run("restore in the running cluster that keeps the grant", func(t *testing.T) {
		l := newResendLog(t)
		l.register("d", "a")
		snap := l.save()
		g := grantReport("r1", "d", "a", grantedP, "sig-1")
		l.mustApply(g)
		l.restore(snap)
		l.wantHolders(grantedP, "a")
		l.resend(g, nil) // already the recipient's: nothing moves
		l.wantHolders(grantedP, "a")
		l.catchUp()
	})
	t.Run("restore in the running cluster, as built before keep_live", func(t *testing.T) {
		l := newResendLog(t)
		l.register("d", "a")
		snap := l.save()
		g := grantReport("r1", "d", "a", grantedP, "sig-1")
		l.mustApply(g)
		l.catchUp() // the statement's memory travels in Raft snapshots
		l.restoreAsBuiltBefore(snap)
		l.wantHolders(grantedP, "d")
		l.resend(g, ErrStatementUsed)
		l.resend(grantReport("r9", "d", "a", grantedP, "sig-1"), ErrStatementUsed)
		l.wantHolders(grantedP, "d")
		l.catchUp()
		l.resend(g, ErrStatementUsed)
	})
	t.Run("whole-cluster restore, the donor still holds the space", func(t *testing.T) {
		l := newResendLog(t)
		l.register("d", "a")
		snap := l.save()
		g := grantReport("r1", "d", "a", grantedP, "sig-1")
		l.mustApply(g)
		l.restoreWholeCluster(snap)
		l.wantHolders(grantedP, "d")
		l.resend(g, nil)
		l.wantHolders(grantedP, "a")
		l.mustApply(returnReport("r2", "a", grantedP))
		l.resend(grantReport("r3", "d", "a", grantedP, "sig-1"), ErrStatementUsed)
		l.wantHolders(grantedP, "d")
	})
	t.Run("whole-cluster restore, b leased the space since", func(t *testing.T) {
		l := newResendLog(t)
		l.register("d", "a")
		snap := l.save()
		g := grantReport("r1", "d", "a", grantedP, "sig-1")
		l.mustApply(g)
		l.restoreWholeCluster(snap)
		l.deleteAndRelease("d")
		l.register("b")
		l.wantHolders(grantedP, "b")
		l.resend(g, ErrBlockConflict)
		l.wantHolders(grantedP, "b")
	})
}

// TestReportResentAfterRequestIDsRolledOver: the same reports sent again
// once their request ids fell out of the masters' memory (the last
// maxRequestIDs requests, filled here with real requests of the log):
// while known, a resend is answered with its first outcome; once
// forgotten, it is judged again against the table as it is, and another
// agent's space stays its own.
func TestReportResentAfterRequestIDsRolledOver(t *testing.T) {
	if testing.Short() {
		// maxRequestIDs real requests: seconds, tens of seconds under -race.
		t.Skip("applies maxRequestIDs requests; run without -short")
	}
	l := newResendLog(t)
	l.register("d", "a", "b")
	g := grantReport("r1", "d", "a", grantedP, "sig-1")
	firstGrant := l.mustApply(g)
	l.mustApply(returnReport("r2", "a", grantedP))
	l.mustApply(grantReport("r3", "d", "b", grantedP, "sig-3"))
	l.mustApply(growRequest("r4", "a"))
	ret := returnReport("r5", "a", grownP)
	firstReturn := l.mustApply(ret)
	l.mustApply(growRequest("r6", "b"))
	l.replay(g, firstGrant)
	l.replay(ret, firstReturn)

	// maxRequestIDs requests of another agent, applied by the first
	// replica; the second is sent its snapshot, as a follower that fell
	// behind (applying them twice, checked one by one, adds nothing).
	fill := command{Op: opReport, Report: &reportCmd{AgentID: "b", Report: api.ReportRequest{Version: 1}}}
	for i := range maxRequestIDs {
		fill.RequestID = fmt.Sprintf("fill-%d", i)
		data, err := fill.Encode()
		if err != nil {
			t.Fatal(err)
		}
		l.index++
		if res := l.tables[0].Apply(l.index, data).(Result); res.Err != nil {
			t.Fatalf("filler request %d: %v", i, res.Err)
		}
	}
	l.catchUp()
	for _, id := range []string{"r1", "r5"} {
		if l.tables[0].requests.known(id) {
			t.Fatalf("request %s is still known after %d others", id, maxRequestIDs)
		}
	}
	l.resend(g, ErrStatementUsed)
	l.resend(ret, ErrBlockConflict)
	l.wantHolders(grantedP, "b")
	l.wantHolders(grownP, "b")
}
