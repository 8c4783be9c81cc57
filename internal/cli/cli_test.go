package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
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

func TestParseEnv(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		want    string // "d n s" after parsing
		unknown []string
		err     string
	}{
		{name: "defaults", want: "30s 3 x"},
		{name: "from the environment", env: []string{"CARVE_WAIT=1m", "CARVE_N=5", "CARVE_SOCK_PATH=y"}, want: "1m0s 5 y"},
		{name: "empty means the default", env: []string{"CARVE_WAIT=", "CARVE_N=", "CARVE_SOCK_PATH="}, want: "30s 3 x"},
		{name: "the command line wins", args: []string{"--n", "7"}, env: []string{"CARVE_N=5"}, want: "30s 7 x"},
		{name: "an excluded flag has no variable", env: []string{"CARVE_DRY_RUN=true"}, want: "30s 3 x", unknown: []string{"CARVE_DRY_RUN"}},
		{name: "unknown variables", env: []string{"CARVE_WAITT=1s", "HOME=/root", "CARVE_N=4"}, want: "30s 4 x", unknown: []string{"CARVE_WAITT"}},
		{name: "a bad duration names the variable", env: []string{"CARVE_WAIT=soon"}, err: `usage: CARVE_WAIT: invalid duration (like 30s or 5m) "soon" (for --wait)`},
		{name: "a bad integer names the variable", env: []string{"CARVE_N=many"}, err: `usage: CARVE_N: invalid integer "many" (for --n)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("carve x", flag.ContinueOnError)
			fs.SetOutput(new(bytes.Buffer))
			d := fs.Duration("wait", 30*time.Second, "")
			n := fs.Int("n", 3, "")
			s := fs.String("sock-path", "x", "")
			fs.Bool("dry-run", false, "")
			_, unknown, err := ParseEnv(fs, tc.args, tc.env, "dry-run")
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) || !errors.Is(err, ErrUsage) {
					t.Fatalf("error %v, want %q (a usage error)", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprintf("%s %d %s", *d, *n, *s); got != tc.want || !slices.Equal(unknown, tc.unknown) {
				t.Errorf("got %q, unknown %q; want %q, %q", got, unknown, tc.want, tc.unknown)
			}
		})
	}
}

func TestNameSource(t *testing.T) {
	fs := flag.NewFlagSet("carve x", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	fs.Duration("wait", 30*time.Second, "")
	fs.Duration("wait-more", 30*time.Second, "")
	fs.String("masters", "", "")
	fs.Bool("dry-run", false, "")
	used, _, err := ParseEnv(fs, nil, []string{"CARVE_WAIT=1ms"}, "dry-run")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ err, want string }{
		{"--wait 1ms: at least 1s", "--wait 1ms: at least 1s (set by CARVE_WAIT)"},
		{"--masters is required", "--masters is required (or CARVE_MASTERS)"},
		{"--wait-more 0s: at least 1s", "--wait-more 0s: at least 1s (or CARVE_WAIT_MORE)"},
		{"--dry-run and nothing else", "--dry-run and nothing else"},
	} {
		if got := NameSource(errors.New(tc.err), fs, used, "dry-run").Error(); got != tc.want {
			t.Errorf("NameSource(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
