package httpapi

import "syscall"

// reservedFDs are the file descriptors a server leaves to the rest of its
// process (Raft's connections and log, bbolt, the listeners, certificate
// reads): a connection cap above the descriptor limit would have accept,
// then every open of the process, fail with EMFILE once the agents filled
// it, where the cap turns them away instead (limitListener).
const reservedFDs = 1024

// capToFDs returns the connection cap that fits in a descriptor limit of
// nofile (0: unknown), and whether it lowered want.
func capToFDs(want int, nofile uint64) (int, bool) {
	if nofile == 0 || nofile > 1<<31 {
		return want, false
	}
	fit := max(int(nofile)-reservedFDs, int(nofile)/2, 1)
	if want <= fit {
		return want, false
	}
	return fit, true
}

// fdLimit is the process's descriptor limit (its soft RLIMIT_NOFILE,
// which the Go runtime raises to the hard one at start); 0 when unknown.
func fdLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == ^uint64(0) {
		return 0
	}
	return r.Cur
}
