package state

import (
	"net/netip"
	"testing"
)

// staleReturnReport is a's return of prefix as an agent of this release
// sends it: naming the version at which a's record lists the block now and
// the table's restore epoch (what a's outbox keeps when it decides).
func (l *resendLog) staleReturnReport(requestID, id, prefix string) command {
	l.t.Helper()
	c := returnReport(requestID, id, prefix)
	p := netip.MustParsePrefix(prefix)
	for _, b := range l.tables[0].agents[id].Leases["g"].Blocks {
		if b.Prefix == p {
			c.Return.Version = b.Version
		}
	}
	if c.Return.Version == 0 {
		l.t.Fatalf("%s holds no block %s", id, prefix)
	}
	c.Return.RestoreEpoch = l.tables[0].restore.RestoreEpoch()
	return c
}

// TestStaleReturnAfterRestore: a return that waited in an agent's outbox
// across a restore of the masters' table (a whole-cluster one, whose log
// repeats the old indexes, or one into the running cluster as built before
// keep_live) is refused when the agent was leased the block anew after the
// restore: freeing it would free space the agent allocates in (the restore
// took back the lease the return was decided on). A return whose block
// the restore kept (a restore into the running cluster keeps what a live
// agent was leased after the snapshot), or decided after the restore, is
// applied; so is one of an agent of an earlier release, which names no
// version (judged as before).
func TestStaleReturnAfterRestore(t *testing.T) {
	runResendCases(t, []resendCase{
		{"decided before a restore (as built before keep_live) that took the grow back, a grew the block again: refused", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			ret := l.staleReturnReport("r1", "a", grownP) // decided; its answer never came
			l.restoreAsBuiltBefore(snap)
			l.wantHolders(grownP)
			l.mustApply(growRequest("r2", "a")) // first fit: the same block
			l.wantHolders(grownP, "a")
			l.resend(ret, ErrBlockConflict)
			l.wantHolders(grownP, "a")
			l.mustApply(l.staleReturnReport("r3", "a", grownP)) // decided anew: applied
			l.wantHolders(grownP)
		}},
		{"a granted block given back to its donor before a restore that kept the grant: applied", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			l.mustApply(grantReport("r0", "d", "a", grantedP, "sig-1"))
			ret := l.staleReturnReport("r1", "a", grantedP)
			l.restore(snap)
			l.wantHolders(grantedP, "a")
			l.resend(ret, nil)
			l.wantHolders(grantedP, "d")
		}},
		{"decided before a restore that kept the block a grew after the snapshot: applied", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			ret := l.staleReturnReport("r1", "a", grownP)
			l.restore(snap)
			l.wantHolders(grownP, "a") // free in the snapshot: a keeps it
			l.resend(ret, nil)
			l.wantHolders(grownP)
		}},
		{"decided before a whole-cluster restore that took the grow back, a grew the block again: refused", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			l.mustApply(growRequest("r1", "b")) // the old log runs on past the new one's indexes
			ret := l.staleReturnReport("r2", "a", grownP)
			l.restoreWholeCluster(snap)
			l.wantHolders(grownP)
			l.mustApply(growRequest("r3", "a"))
			l.wantHolders(grownP, "a")
			l.resend(ret, ErrBlockConflict)
			l.wantHolders(grownP, "a")
		}},
		{"decided before a whole-cluster restore that kept the block: applied", func(l *resendLog) {
			l.register("a", "b", "c")
			l.mustApply(growRequest("r0", "a"))
			snap := l.save()
			ret := l.staleReturnReport("r1", "a", grownP)
			l.restoreWholeCluster(snap)
			l.wantHolders(grownP, "a")
			l.resend(ret, nil)
			l.wantHolders(grownP)
		}},
		{"decided before a restore that kept the block: applied", func(l *resendLog) {
			l.register("a", "b", "c")
			l.mustApply(growRequest("r0", "a"))
			snap := l.save()
			ret := l.staleReturnReport("r1", "a", grownP)
			l.restore(snap)
			l.wantHolders(grownP, "a")
			l.resend(ret, nil)
			l.wantHolders(grownP)
		}},
		{"decided after the restore, of a block it kept: applied", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			l.restore(snap)
			l.resend(l.staleReturnReport("r1", "a", grownP), nil)
			l.wantHolders(grownP)
		}},
		{"a granted block given back to its donor before a restore (as built before keep_live) that took the grant back, granted anew: refused", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			l.mustApply(grantReport("r0", "d", "a", grantedP, "sig-1"))
			ret := l.staleReturnReport("r1", "a", grantedP) // back to d through the ring; the answer never came
			l.restoreAsBuiltBefore(snap)
			l.wantHolders(grantedP, "d")
			l.mustApply(grantReport("r2", "d", "a", grantedP, "sig-2")) // first fit in d's ring: the same block
			l.wantHolders(grantedP, "a")
			l.resend(ret, ErrBlockConflict)
			l.wantHolders(grantedP, "a")
			l.mustApply(l.staleReturnReport("r3", "a", grantedP)) // decided anew: back to d
			l.wantHolders(grantedP, "d")
		}},
		{"of an agent of an earlier release (no version): judged as before", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			l.restore(snap)
			l.mustApply(growRequest("r1", "a"))
			l.resend(returnReport("r2", "a", grownP), nil)
			l.wantHolders(grownP)
		}},
	})
}
