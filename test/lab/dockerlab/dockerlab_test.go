package dockerlab

import (
	"bytes"
	"testing"
)

// TestDemux reads Docker's multiplexed exec output: frames of stdout and
// stderr, in order, a truncated last frame kept as far as it goes.
func TestDemux(t *testing.T) {
	frame := func(stream byte, s string) []byte {
		n := len(s)
		return append([]byte{stream, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, s...)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, ""},
		{"stdout", frame(1, "PING 10.0.0.2\n"), "PING 10.0.0.2\n"},
		{"both streams", append(frame(1, "out\n"), frame(2, "err\n")...), "out\nerr\n"},
		{"truncated", frame(1, "abcdef")[:11], "abc"},
		{"short header", []byte{1, 0, 0}, ""},
	} {
		if got := demux(tc.in); !bytes.Equal(got, []byte(tc.want)) {
			t.Errorf("%s: demux = %q, want %q", tc.name, got, tc.want)
		}
	}
}
