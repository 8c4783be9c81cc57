package state

import (
	"testing"
)

// TestRestoreKeepsLiveAgentsBlocks: a restore into the running cluster
// leaves an agent it keeps the blocks it grew, or was granted, after the
// snapshot: its containers hold addresses there, and freed, the space
// would be leased again while they live. Whatever the snapshot says of
// that space (free, quarantined, another agent's lease, which that agent
// gave up since) gives way. Each case runs on two replicas, one of them
// caught up from a Raft snapshot, which must agree.
func TestRestoreKeepsLiveAgentsBlocks(t *testing.T) {
	runResendCases(t, []resendCase{
		{"grown after the snapshot, free in it: kept, and no other agent is leased it", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			l.restore(snap)
			l.wantHolders(grownP, "a")
			l.mustApply(growRequest("r1", "b"))
			l.wantHolders(grownP, "a")
		}},
		{"grown after the snapshot where the snapshot leases another agent, which returned it since: kept", func(l *resendLog) {
			l.register("a", "b", "c")
			l.mustApply(growRequest("r0", "b"))
			snap := l.save()
			l.mustApply(returnReport("r1", "b", grownP))
			l.mustApply(growRequest("r2", "a"))
			l.restore(snap)
			l.wantHolders(grownP, "a")
		}},
		{"granted after the snapshot out of the donor's first lease: kept, cut out of the donor's", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			l.mustApply(grantReport("r0", "d", "a", grantedP, "sig-1"))
			l.restore(snap)
			l.wantHolders(grantedP, "a")
			l.wantHolders("10.9.0.0/26", "d")
			l.wantHolders("10.9.0.128/25", "d")
		}},
		{"deleted after the snapshot, its space leased to a since: the restored agent's record without it", func(l *resendLog) {
			l.register("a", "x", "b") // x: 10.9.1.0/24
			snap := l.save()
			l.deleteAndRelease("x")
			l.mustApply(growRequest("r0", "a")) // first fit: inside x's old space
			l.wantHolders("10.9.1.0/25", "a")
			l.restore(snap)
			l.wantHolders("10.9.1.0/25", "a")
			l.wantHolders("10.9.1.128/25", "x")
		}},
		{"granted after the snapshot out of a block the donor grew after it: each keeps its part", func(l *resendLog) {
			l.register("d", "a", "b")
			snap := l.save()
			l.mustApply(growRequest("r0", "d"))
			l.mustApply(grantReport("r1", "d", "a", "10.9.3.64/26", "sig-1"))
			l.restore(snap)
			l.wantHolders("10.9.3.0/26", "d")
			l.wantHolders("10.9.3.64/26", "a")
		}},
		{"grown after the snapshot into a quarantine the snapshot holds: the quarantine's part taken over", func(l *resendLog) {
			l.register("a", "x", "b") // x: 10.9.1.0/24
			l.mustApply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"x"}}})
			snap := l.save() // x's space quarantined
			if res := l.mustApply(command{Op: opRelease, Release: &releaseCmd{Acks: l.acks()}}); res.Released == 0 {
				l.t.Fatal("x's quarantine was not released")
			}
			l.mustApply(growRequest("r0", "a")) // first fit: inside x's old space
			l.wantHolders("10.9.1.0/25", "a")
			l.restore(snap)
			l.wantHolders("10.9.1.0/25", "a")
			l.wantHolders("10.9.1.128/25", "quarantine:x")
		}},
		{"deleted and registered again after the snapshot with another subnet: kept as grown blocks beside the snapshot's", func(l *resendLog) {
			l.register("a", "b", "c") // a: 10.9.0.0/24
			snap := l.save()
			l.mustApply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a"}}})
			l.mustApply(grantReport("r0", "a", "b", grantedP, "sig-1")) // reported late: out of a's quarantine
			l.register("a")                                             // its slice is no longer wholly its own
			l.wantHolders("10.9.3.0/24", "a")
			l.restore(snap)
			l.wantHolders("10.9.3.0/24", "a")
			l.wantHolders(grantedP, "b")
			l.wantHolders("10.9.0.0/26", "a")
			l.wantHolders("10.9.0.128/25", "a")
		}},
		{"a restore entry of a build before keep_live takes the grow back, as it was applied", func(l *resendLog) {
			l.register("a", "b", "c")
			snap := l.save()
			l.mustApply(growRequest("r0", "a"))
			l.epoch++
			l.mustApply(command{Op: opRestore, Restore: &restoreCmd{Epoch: uint64(l.epoch), Snapshot: snap, Quarantine: true}})
			l.wantHolders(grownP)
		}},
	})
}
