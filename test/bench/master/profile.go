package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// profiler profiles the measured span of the first registration row run
// (after the leader is elected and every client connected, until the last
// registration is answered): the masters run in this process, so the
// profiles are the cluster's. Select the row with -only.
type profiler struct {
	opts      options
	cpu       *os.File
	done      bool
	profiling bool
}

func newProfiler(opts options) (*profiler, error) {
	p := &profiler{opts: opts}
	if opts.cpuProfile != "" {
		f, err := os.Create(opts.cpuProfile)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		p.cpu = f
	}
	return p, nil
}

// start starts the profiles at the first measured span.
func (p *profiler) start() error {
	if p.done {
		return nil
	}
	p.profiling = true
	if p.opts.mutexProfile != "" {
		runtime.SetMutexProfileFraction(5)
	}
	if p.opts.blockProfile != "" {
		runtime.SetBlockProfileRate(10_000) // a sample per 10µs blocked
	}
	if p.cpu != nil {
		return pprof.StartCPUProfile(p.cpu)
	}
	return nil
}

// stop stops the profiles at the end of the first measured span.
func (p *profiler) stop() {
	if !p.profiling {
		return
	}
	p.profiling, p.done = false, true
	runtime.SetMutexProfileFraction(0)
	runtime.SetBlockProfileRate(0)
	if p.cpu != nil {
		pprof.StopCPUProfile()
	}
}

// write writes the mutex and block profiles and closes the CPU one.
func (p *profiler) write() error {
	p.stop()
	var errs []error
	if p.cpu != nil {
		errs = append(errs, p.cpu.Close())
	}
	for _, w := range []struct{ name, file string }{{"mutex", p.opts.mutexProfile}, {"block", p.opts.blockProfile}} {
		if w.file == "" {
			continue
		}
		f, err := os.Create(w.file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, pprof.Lookup(w.name).WriteTo(f, 0), f.Close())
	}
	return errors.Join(errs...)
}
