package httpapi

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"time"

	"github.com/carve-net/carve/internal/ratelog"
)

// handshakeLogInterval is how often a server logs a failed TLS handshake:
// anyone who can reach the port can fail one, as fast as they like.
const handshakeLogInterval = 10 * time.Second

// handshakeErrorPrefix starts net/http's log line of a failed TLS
// handshake.
var handshakeErrorPrefix = []byte("http: TLS handshake error")

// NewErrorLog is the ErrorLog of a carve server: its errors go to logger
// as warnings, except failed TLS handshakes, which are counted with
// onHandshakeFailure (when set) every time and logged at most once per
// handshakeLogInterval (the others at debug level).
func NewErrorLog(logger *slog.Logger, onHandshakeFailure func()) *log.Logger {
	return log.New(&errorLogWriter{log: logger, count: onHandshakeFailure, limit: ratelog.New(handshakeLogInterval)}, "", 0)
}

type errorLogWriter struct {
	log   *slog.Logger
	count func()
	limit *ratelog.Limiter
}

func (w *errorLogWriter) Write(p []byte) (int, error) {
	msg := string(bytes.TrimRight(p, "\n"))
	if !bytes.HasPrefix(p, handshakeErrorPrefix) {
		w.log.Warn(msg)
		return len(p), nil
	}
	if w.count != nil {
		w.count()
	}
	if ok, suppressed := w.limit.Allow(); ok {
		w.log.Warn(msg, "not_logged_since", suppressed, "next_in", handshakeLogInterval)
	} else {
		w.log.Log(context.Background(), slog.LevelDebug, msg)
	}
	return len(p), nil
}
