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

func TestParseOperands(t *testing.T) {
	tests := []struct {
		args     []string
		operands []string
		n        int
		err      string
	}{
		{args: nil},
		{args: []string{"a", "b"}, operands: []string{"a", "b"}},
		{args: []string{"a", "--n", "3", "b"}, operands: []string{"a", "b"}, n: 3},
		{args: []string{"--n=2", "a"}, operands: []string{"a"}, n: 2},
		{args: []string{"a", "--", "--n", "b"}, operands: []string{"a", "--n", "b"}},
		{args: []string{"a", "--nope"}, err: "usage: flag provided but not defined: -nope"},
		{args: []string{"a", "-h"}, err: flag.ErrHelp.Error()},
	}
	for _, tc := range tests {
		fs := flag.NewFlagSet("carve x", flag.ContinueOnError)
		fs.SetOutput(new(bytes.Buffer))
		n := fs.Int("n", 0, "a number")
		got, err := ParseOperands(fs, tc.args)
		switch {
		case tc.err != "":
			if err == nil || err.Error() != tc.err {
				t.Errorf("args %q: error %v, want %q", tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("args %q: %v", tc.args, err)
		case fmt.Sprint(got) != fmt.Sprint(tc.operands) || *n != tc.n:
			t.Errorf("args %q: operands %q, n %d; want %q, %d", tc.args, got, *n, tc.operands, tc.n)
		}
	}
}
