package api

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFrameReaderReadsWhatIsWritten: frames of every kind, gzip'ed or not,
// read back as written; unknown kinds are skipped; the end of the input
// between frames is io.EOF.
func TestFrameReaderReadsWhatIsWritten(t *testing.T) {
	ch := Changes{Index: 7, Since: 3, ClusterID: "c1", Agents: []AgentInfo{{AgentID: "a1"}}}
	var stream []byte
	stream = AppendFrame(stream, FrameChanges, mustJSON(t, ch))
	stream = AppendFrame(stream, "future-kind", []byte("whatever\nit holds"))
	stream = AppendFrame(stream, FrameHeartbeat, mustJSON(t, StreamHeartbeat{Index: 7}))
	stream = AppendFrame(stream, FrameChangesGzip, gzipped(t, mustJSON(t, ch)))
	stream = AppendFrame(stream, FrameEnd, mustJSON(t, Error{Code: CodeGone, Oldest: 5, Message: "gone"}))
	r := NewFrameReader(bytes.NewReader(stream))
	want := []func(Frame) bool{
		func(f Frame) bool {
			return f.Kind == FrameChanges && f.Changes.Index == 7 && f.Changes.Agents[0].AgentID == "a1"
		},
		func(f Frame) bool { return f.Kind == FrameHeartbeat && f.Heartbeat.Index == 7 },
		func(f Frame) bool {
			return f.Kind == FrameChanges && f.Changes.Since == 3 && f.Changes.ClusterID == "c1"
		},
		func(f Frame) bool { return f.Kind == FrameEnd && f.End.Code == CodeGone && f.End.Oldest == 5 },
	}
	for i, ok := range want {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !ok(f) {
			t.Fatalf("frame %d: %+v", i, f)
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// TestFrameReaderRefusesWhatIsNotFrames: each malformed stream is an
// error naming what is wrong, never a frame.
func TestFrameReaderRefusesWhatIsNotFrames(t *testing.T) {
	tests := []struct {
		name, stream string
		want         error
	}{
		{"no length", "changes\n{}", ErrBadFrame},
		{"negative length", "changes -1\n", ErrBadFrame},
		{"length beyond the bound", "changes 999999999999\n", ErrBadFrame},
		{"header too long", strings.Repeat("x", 100) + " 1\n", ErrBadFrame},
		{"cut header", "changes 1", io.ErrUnexpectedEOF},
		{"cut payload", "changes 10\n{}", io.ErrUnexpectedEOF},
		{"not JSON", "changes 3\nabc", ErrBadFrame},
		{"not gzip", "changes-gzip 2\n{}", ErrBadFrame},
		{"heartbeat not JSON", "heartbeat 1\n[", ErrBadFrame},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewFrameReader(strings.NewReader(tt.stream)).Next()
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// FuzzFrameReader: a stream from the network never panics the reader,
// and each frame it returns is whole: a changes frame with its Changes, a
// heartbeat with its index, an end with a code.
func FuzzFrameReader(f *testing.F) {
	ch := mustJSON(f, Changes{Index: 2, Since: 1, Agents: []AgentInfo{{AgentID: "a"}}})
	f.Add([]byte{})
	f.Add(AppendFrame(nil, FrameChanges, ch))
	f.Add(AppendFrame(nil, FrameChangesGzip, gzipped(f, ch)))
	f.Add(AppendFrame(nil, FrameHeartbeat, []byte(`{"index":3}`)))
	f.Add(AppendFrame(nil, FrameEnd, []byte(`{"code":"gone","oldest":4,"error":"x"}`)))
	f.Add(AppendFrame(AppendFrame(nil, "other", []byte("x")), FrameEnd, []byte(`{}`)))
	f.Add([]byte("changes 99999999\n"))
	f.Add([]byte("changes-gzip 4\n\x1f\x8b\x08\x00"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := NewFrameReader(bytes.NewReader(raw))
		for range 64 {
			fr, err := r.Next()
			if err != nil {
				return
			}
			switch {
			case fr.Kind == FrameChanges && fr.Changes != nil:
			case fr.Kind == FrameHeartbeat && fr.Heartbeat != nil:
			case fr.Kind == FrameEnd && fr.End != nil && fr.End.Code != "":
			default:
				t.Fatalf("frame %+v is not whole", fr)
			}
		}
	})
}
