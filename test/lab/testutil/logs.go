package testutil

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Logs is a slog.Handler that keeps every record, so that a test can wait
// for a message (with Eventually) instead of reading a process's stderr.
// Safe for concurrent use.
type Logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Logger returns a logger that records into l, at every level.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

// Enabled records every level.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs drops the attributes: tests look at messages.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup drops the group.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Handle keeps the record.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}

// Has reports whether a record at level has a message containing sub.
func (l *Logs) Has(level slog.Level, sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.recs, func(r slog.Record) bool { return r.Level == level && strings.Contains(r.Message, sub) })
}

// Count is the number of records at level whose message contains sub.
func (l *Logs) Count(level slog.Level, sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level && strings.Contains(r.Message, sub) {
			n++
		}
	}
	return n
}
