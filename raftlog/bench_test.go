package raftlog

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkApply measures Apply throughput through a 3-node cluster on
// loopback (real TCP, real fsync) with 1, 64 and 1000 concurrent callers, with
// production timeouts and batching settings. It reports applies/s and, so
// that results compare across machines, the ratio to the single-caller rate
// measured in the same run (x_vs_1caller):
//
//	go test -run '^$' -bench BenchmarkApply -benchtime 5000x ./raftlog/
func BenchmarkApply(b *testing.B) {
	c := newCluster(b, 3, func(cfg *Config) {
		// Production defaults, not the test's fast timeouts.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 0, 0, 0
	})
	leader := c.waitLeader()
	payload := make([]byte, 200) // about the size of a lease command
	var baseline float64
	var seq atomic.Int64
	for _, callers := range []int{1, 64, 1000} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			var failed atomic.Int64
			b.ResetTimer()
			start := time.Now()
			for w := 0; w < callers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cmd := make([]byte, len(payload)+16)
					for next.Add(1) <= int64(b.N) {
						copy(cmd, fmt.Sprintf("%016d", seq.Add(1)))
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						_, _, err := leader.node.Apply(ctx, cmd)
						cancel()
						if err != nil {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d applies failed", n)
			}
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "applies/s")
			if callers == 1 {
				baseline = rate
			}
			if baseline > 0 {
				b.ReportMetric(rate/baseline, "x_vs_1caller")
			}
		})
	}
}
