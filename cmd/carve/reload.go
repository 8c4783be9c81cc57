package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// ignoreSIGHUP ignores SIGHUP until reloadOnSIGHUP takes it: a reload
// asked while the process starts (systemctl reload too early) must not stop
// it, SIGHUP's default.
func ignoreSIGHUP() { signal.Ignore(syscall.SIGHUP) }

// reloadOnSIGHUP calls reload at every SIGHUP until ctx ends: masters and
// agents read their rotated files again without a restart
// (docs/security.md, "Rotation"). A failed reload keeps what was loaded
// before, and is logged as an error naming the file.
func reloadOnSIGHUP(ctx context.Context, log *slog.Logger, what string, reload func() error) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				if err := reload(); err != nil {
					log.Error("SIGHUP: reloading "+what+" failed; keeping what was loaded before", "err", err)
					continue
				}
				log.Info("SIGHUP: reloaded " + what)
			}
		}
	}()
}
