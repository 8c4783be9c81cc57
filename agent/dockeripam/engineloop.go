package dockeripam

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/carve-net/carve/internal/goroutines"
)

// engineLoop connects to the engine, retrying slowly while there is none.
func (s *Service) engineLoop(ctx context.Context) {
	for {
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		// No engine at the configured host: there are no containers of its
		// to take back addresses for, so requests need not wait.
		s.driver.markReady()
		s.mu.Lock()
		s.status.Engine = EngineStatus{Host: s.opts.DockerHost, Error: err.Error(), Absent: errors.Is(err, fs.ErrNotExist)}
		s.status.Containers, s.status.ContainersListed = nil, time.Time{}
		for i := range s.status.Networks {
			if s.status.Networks[i].State == NetworkOK {
				s.status.Networks[i].State = NetworkPending
			}
		}
		s.mu.Unlock()
		s.note("engine", slog.LevelWarn, "docker engine unavailable; retrying", "host", s.opts.DockerHost, "err", err, "retry", s.opts.EngineRetry)
		t := time.NewTimer(s.opts.EngineRetry)
	wait:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				break wait
			case done := <-s.gcCh:
				done <- fmt.Errorf("no Docker engine connected: %w", err)
			}
		}
	}
}

// session runs while the engine answers: it ensures the networks, follows
// the events and collects leaks. It returns why the engine was lost.
func (s *Service) session(ctx context.Context) error {
	c, err := newEngineClient(s.opts.DockerHost)
	if err != nil {
		return err
	}
	defer c.close()
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	v, err := c.connect(cctx)
	cancel()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.status.Engine = EngineStatus{Host: s.opts.DockerHost, Connected: true, Version: v.Version, APIVersion: c.version}
	s.mu.Unlock()
	s.note("engine", slog.LevelInfo, "docker engine connected", "host", s.opts.DockerHost, "version", v.Version, "api", c.version)

	// The event stream reads through c: the session stops it and waits
	// for it before c closes (deferred above, so run after).
	events := goroutines.New(ctx)
	defer events.Stop()
	evCh := make(chan struct{}, 1)
	evErr := make(chan error, 1)
	startEvents := func() {
		events.Go(func(ctx context.Context) {
			evErr <- c.events(ctx, func(ev event) {
				s.log.Debug("docker event", "type", ev.Type, "action", ev.Action, "actor", ev.Actor.ID)
				select {
				case evCh <- struct{}{}:
				default:
				}
			})
		})
	}
	startEvents()

	// The take-back first (collect lists the running containers' addresses
	// and claims those the agent does not hold): RequestAddress waits for
	// it. Then the networks. While the agent has not restored an overlay
	// that running containers use, or the engine could not be listed, the
	// take-back is tried again every TakeBackRetry.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	collect := func() {
		_ = s.collect(ctx, c)
		if s.driver.takeBackWaiting() {
			retry.Reset(s.opts.TakeBackRetry)
		}
	}
	collect()
	s.ensureAll(ctx, c)

	syncT := time.NewTicker(s.opts.SyncInterval)
	defer syncT.Stop()
	gcT := time.NewTicker(s.opts.GCInterval)
	defer gcT.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.syncCh:
			s.ensureAll(ctx, c)
			// The agent's leases changed: an overlay the take-back waits
			// for may be restored now.
			if s.driver.takeBackWaiting() {
				collect()
			}
		case <-syncT.C:
			s.ensureNew(ctx, c)
		case <-gcT.C:
			// Also re-checks the networks: one removed by hand comes back.
			s.ensureAll(ctx, c)
			collect()
		case <-retry.C:
			collect()
		case <-evCh:
			debounce.Reset(eventDebounce)
		case <-debounce.C:
			collect()
		case done := <-s.gcCh:
			err := s.collect(ctx, c)
			if s.driver.takeBackWaiting() {
				retry.Reset(s.opts.TakeBackRetry)
			}
			done <- err
		case err := <-evErr:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The stream broke: the engine stopped, or restarted.
			pctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
			_, perr := c.connect(pctx)
			cancel()
			if perr != nil {
				return perr
			}
			s.note("events", slog.LevelWarn, "docker event stream ended; following it again", "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			startEvents()
		}
	}
}
