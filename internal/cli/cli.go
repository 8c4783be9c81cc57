// Package cli holds what carve's commands (cmd/carve, test/cmd/carve-lab) share
// on the command line: flag sets that report errors instead of exiting,
// refusal of stray arguments, subcommands, reports as tables or JSON, and
// one mapping of errors to exit codes.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// ErrUsage marks a command-line error: Exit prints it with exit code 2.
var ErrUsage = errors.New("usage")

// NewFlagSet returns a flag set that reports errors instead of exiting and
// prints its help on stderr.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

// Parse parses args and refuses stray arguments; errors wrap ErrUsage,
// except flag.ErrHelp for -h.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	return nil
}

// ParseOperands parses args whose flags and operands may come in any order
// (carve agents delete h1 h2 --json) and returns the operands; everything
// after "--" is an operand. Errors wrap ErrUsage, except flag.ErrHelp.
func ParseOperands(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(operands, rest...), nil
		}
		if len(rest) == 0 {
			return operands, nil
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
}

// ExitCode is the process exit code for a command's result: 0 for success
// and -h, 2 for a usage error, 1 for any other failure.
func ExitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	default:
		return 1
	}
}

// Report writes "name: err" to w when err is a failure (not -h) and returns
// the exit code for it.
func Report(w io.Writer, name string, err error) int {
	code := ExitCode(err)
	if code != 0 {
		fmt.Fprintf(w, "%s: %v\n", name, err)
	}
	return code
}
