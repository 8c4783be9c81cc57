package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Subcommand runs the subcommand that args[0] names: name is the command
// ("carve ipam"), usage its help, printed on out for help, -h and --help
// (then it returns flag.ErrHelp); an absent or unknown subcommand wraps
// ErrUsage.
func Subcommand(name, usage string, args []string, out io.Writer, subs map[string]func(args []string) error) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s needs a subcommand\n%s", ErrUsage, name, usage)
	}
	if run, ok := subs[args[0]]; ok {
		return run(args[1:])
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(out, usage)
		return flag.ErrHelp
	}
	return fmt.Errorf("%w: %s %q: unknown subcommand\n%s", ErrUsage, name, args[0], usage)
}

// PrintReport prints a command's report: as JSON with --json, else as the
// command's table.
func PrintReport[R any](out io.Writer, asJSON bool, rep R, table func(io.Writer, R) error) error {
	if asJSON {
		return WriteJSON(out, rep)
	}
	return table(out, rep)
}

// WriteJSON prints v indented, as every --json does.
func WriteJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ErrUnhealthy is returned after a report that found problems: the command
// exits 1.
var ErrUnhealthy = errors.New("problems found")

// OrDash is s, or "-" in a table's empty cell.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Listed joins the names listed, saying how many more there are of count.
func Listed(names []string, count int) string {
	s := strings.Join(names, ", ")
	if more := count - len(names); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}
