package main

import (
	"syscall"
	"time"
)

// cpuClock reads the CPU time this process has used (user and system,
// every goroutine: the three masters and the clients all run here).
type cpuClock struct{ start time.Duration }

// processCPU is the process's CPU time so far; 0 when it cannot be read.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPUClock() cpuClock { return cpuClock{start: processCPU()} }

// since is the CPU time used since the clock started.
func (c cpuClock) since() time.Duration { return processCPU() - c.start }
