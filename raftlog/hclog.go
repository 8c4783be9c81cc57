package raftlog

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// levelTrace is below slog.LevelDebug so that raft's trace output (per-RPC
// chatter) stays invisible even when an operator turns debug logging on.
const levelTrace = slog.LevelDebug - 4

// demote re-levels raft messages that are routine in a healthy cluster: a
// stopped peer makes the leader log replication failures with back-off at
// ERROR, and pipelining starts/stops at INFO on every leadership or
// connection change. The message texts are raft's; other messages keep their
// level.
func demote(msg string, level hclog.Level) hclog.Level {
	var to hclog.Level
	switch msg {
	case "failed to appendEntries to", "failed to heartbeat to",
		"failed to make requestVote RPC", "failed to start pipeline replication to":
		to = hclog.Warn
	case "rejecting pre-vote request since we have a leader",
		"rejecting vote request since we have a leader":
		to = hclog.Info
	case "pipelining replication", "aborting pipeline replication":
		to = hclog.Debug
	default:
		return level
	}
	return min(to, level)
}

// slogHCLog adapts an *slog.Logger to the hclog.Logger interface that
// hashicorp/raft and its transport expect, so that all of raft's output goes
// through the application's structured logger with the same handler, fields and
// level filtering. Level filtering is delegated to the slog handler; SetLevel is
// accepted but ignored for that reason.
type slogHCLog struct {
	base    *slog.Logger // the application's logger, without our attributes
	l       *slog.Logger // base with "logger" and the implied arguments
	name    string
	implied []any
}

var _ hclog.Logger = (*slogHCLog)(nil)

// newHCLogger returns an hclog.Logger writing to l under the given name.
func newHCLogger(l *slog.Logger, name string) hclog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return build(l, name, nil)
}

func build(base *slog.Logger, name string, implied []any) *slogHCLog {
	l := base
	if name != "" {
		l = l.With("logger", name)
	}
	if len(implied) > 0 {
		l = l.With(convertArgs(implied)...)
	}
	return &slogHCLog{base: base, l: l, name: name, implied: implied}
}

func toSlogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return levelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default: // Info, NoLevel, Off and anything unknown
		return slog.LevelInfo
	}
}

// convertArgs turns hclog's key/value list into slog's, rendering hclog's
// formatting helper types, which slog does not know.
func convertArgs(args []any) []any {
	if len(args) == 0 {
		return nil
	}
	out := make([]any, 0, len(args)+1)
	for i, a := range args {
		if i%2 == 0 {
			if i == len(args)-1 {
				// hclog's convention for an odd argument count.
				out = append(out, "EXTRA_VALUE_AT_END", a)
				break
			}
			out = append(out, fmt.Sprint(a))
			continue
		}
		switch v := a.(type) {
		case hclog.Format:
			if len(v) > 0 {
				if f, ok := v[0].(string); ok {
					out = append(out, fmt.Sprintf(f, v[1:]...))
					continue
				}
			}
			out = append(out, fmt.Sprint([]any(v)...))
		case hclog.Hex:
			out = append(out, fmt.Sprintf("0x%x", int(v)))
		case hclog.Octal:
			out = append(out, fmt.Sprintf("0%o", int(v)))
		case hclog.Binary:
			out = append(out, fmt.Sprintf("0b%b", int(v)))
		case hclog.Quote:
			out = append(out, fmt.Sprintf("%q", string(v)))
		case error:
			out = append(out, v.Error())
		default:
			out = append(out, a)
		}
	}
	return out
}

func (h *slogHCLog) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	level = demote(msg, level)
	lvl := toSlogLevel(level)
	ctx := context.Background()
	if !h.l.Enabled(ctx, lvl) {
		return
	}
	h.l.Log(ctx, lvl, msg, convertArgs(args)...)
}

func (h *slogHCLog) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *slogHCLog) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *slogHCLog) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *slogHCLog) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *slogHCLog) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *slogHCLog) enabled(l slog.Level) bool { return h.l.Enabled(context.Background(), l) }

func (h *slogHCLog) IsTrace() bool { return h.enabled(levelTrace) }
func (h *slogHCLog) IsDebug() bool { return h.enabled(slog.LevelDebug) }
func (h *slogHCLog) IsInfo() bool  { return h.enabled(slog.LevelInfo) }
func (h *slogHCLog) IsWarn() bool  { return h.enabled(slog.LevelWarn) }
func (h *slogHCLog) IsError() bool { return h.enabled(slog.LevelError) }

func (h *slogHCLog) ImpliedArgs() []any { return h.implied }

func (h *slogHCLog) With(args ...any) hclog.Logger {
	implied := append(append([]any(nil), h.implied...), args...)
	return build(h.base, h.name, implied)
}

func (h *slogHCLog) Name() string { return h.name }

func (h *slogHCLog) Named(name string) hclog.Logger {
	full := name
	if h.name != "" {
		full = h.name + "." + name
	}
	return build(h.base, full, h.implied)
}

func (h *slogHCLog) ResetNamed(name string) hclog.Logger {
	return build(h.base, name, h.implied)
}

// SetLevel is a no-op: the slog handler decides what is emitted.
func (h *slogHCLog) SetLevel(hclog.Level) {}

func (h *slogHCLog) GetLevel() hclog.Level {
	switch {
	case h.IsTrace():
		return hclog.Trace
	case h.IsDebug():
		return hclog.Debug
	case h.IsInfo():
		return hclog.Info
	case h.IsWarn():
		return hclog.Warn
	case h.IsError():
		return hclog.Error
	default:
		return hclog.Off
	}
}

func (h *slogHCLog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *slogHCLog) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	w := &stdWriter{h: h, level: hclog.Info}
	if opts != nil {
		w.infer = opts.InferLevels
		if opts.ForceLevel != hclog.NoLevel {
			w.level = opts.ForceLevel
			w.infer = false
		}
	}
	return w
}

// stdWriter turns lines written through a standard library *log.Logger into
// structured records, optionally recognising "[WARN]"-style prefixes.
type stdWriter struct {
	h     *slogHCLog
	level hclog.Level
	infer bool
	mu    sync.Mutex
}

func (w *stdWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		msg := strings.TrimSpace(string(line))
		if msg == "" {
			continue
		}
		level := w.level
		if w.infer {
			level, msg = inferLevel(msg, level)
		}
		w.h.Log(level, msg)
	}
	return len(p), nil
}

func inferLevel(msg string, def hclog.Level) (hclog.Level, string) {
	prefixes := []struct {
		p string
		l hclog.Level
	}{
		{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info},
		{"[WARN]", hclog.Warn}, {"[ERROR]", hclog.Error}, {"[ERR]", hclog.Error},
	}
	for _, p := range prefixes {
		if strings.HasPrefix(msg, p.p) {
			return p.l, strings.TrimSpace(strings.TrimPrefix(msg, p.p))
		}
	}
	return def, msg
}
