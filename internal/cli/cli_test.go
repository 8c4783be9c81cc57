package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"
)

func TestParseAndReport(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		wantOut  string
	}{
		{[]string{"--n", "3"}, 0, ""},
		{[]string{"-h"}, 0, ""},
		{[]string{"--nope"}, 2, "carve x: usage: flag provided but not defined: -nope\n"},
		{[]string{"extra"}, 2, "carve x: usage: unexpected argument \"extra\"\n"},
		{[]string{"--n", "x"}, 2, "carve x: usage: invalid value"},
	}
	for _, tc := range tests {
		fs := flag.NewFlagSet("carve x", flag.ContinueOnError)
		fs.SetOutput(new(bytes.Buffer))
		fs.Int("n", 0, "a number")
		var out bytes.Buffer
		code := Report(&out, "carve x", Parse(fs, tc.args))
		if code != tc.wantCode || !bytes.HasPrefix(out.Bytes(), []byte(tc.wantOut)) {
			t.Errorf("args %q: code %d, output %q; want %d, %q", tc.args, code, out.String(), tc.wantCode, tc.wantOut)
		}
	}
	if code := ExitCode(fmt.Errorf("read state: %w", errors.New("boom"))); code != 1 {
		t.Errorf("ExitCode(failure) = %d, want 1", code)
	}
}
