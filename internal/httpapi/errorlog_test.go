package httpapi

import (
	"log/slog"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

// Failed handshakes are counted every time and logged as a warning once
// per interval; the server's other errors are always warnings.
func TestErrorLogLimitsHandshakeFailures(t *testing.T) {
	logs := &testutil.Logs{}
	var failures int
	l := NewErrorLog(logs.Logger(), func() { failures++ })
	for range 100 {
		l.Printf("http: TLS handshake error from 127.0.0.1:4242: remote error: tls: bad certificate")
	}
	l.Printf("http: Accept error: too many open files")
	if failures != 100 {
		t.Errorf("counted %d handshake failures, want 100", failures)
	}
	if warned := logs.Count(slog.LevelWarn, "TLS handshake error"); warned != 1 {
		t.Errorf("%d handshake warnings, want 1", warned)
	}
	if !logs.Has(slog.LevelWarn, "too many open files") {
		t.Error("another server error was not logged as a warning")
	}
}
