package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"

	"github.com/carve-net/carve/internal/cli"
)

// warnUnknownEnv logs the CARVE_ variables of the environment that are no
// flag's of the command: a misspelt name in an env file would otherwise be
// ignored in silence.
func warnUnknownEnv(logger *slog.Logger, command string, unknown []string) {
	for _, name := range unknown {
		logger.Warn("an environment variable is no flag's of "+command+": misspelt? (each flag --x-y has the variable CARVE_X_Y)", "variable", name)
	}
}

// printCheckedConfig prints what --check-config found: every flag with
// its value and where the value came from (the command line, its CARVE_
// variable, or the default).
func printCheckedConfig(w io.Writer, command string, fs *flag.FlagSet, fromEnv map[string]string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fmt.Fprintf(w, "%s: the configuration is valid\n", command)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLAG\tVALUE\tFROM")
	fs.VisitAll(func(f *flag.Flag) {
		from := "default"
		switch {
		case fromEnv[f.Name] != "":
			from = fromEnv[f.Name]
		case given[f.Name]:
			from = "command line"
		}
		fmt.Fprintf(tw, "--%s\t%q\t%s\n", f.Name, f.Value.String(), from)
	})
	return tw.Flush()
}

// envFlagsExcluded are the daemons' flags without a CARVE_ variable.
var envFlagsExcluded = []string{"check-config"}

// daemonFlags is a daemon's (carve master, carve agent) parsed command
// line and environment, and the logger its --log-level asked for.
type daemonFlags struct {
	command string
	fs      *flag.FlagSet
	fromEnv map[string]string
	logger  *slog.Logger
	level   *slog.LevelVar
}

// parseDaemon parses a daemon's flags and their CARVE_ variables, builds
// its logger at *logLevel and warns about CARVE_ variables of no flag.
func parseDaemon(command string, fs *flag.FlagSet, args []string, logLevel *string) (*daemonFlags, error) {
	fromEnv, unknown, err := cli.ParseEnv(fs, args, os.Environ(), envFlagsExcluded...)
	if err != nil {
		return nil, err
	}
	d := &daemonFlags{command: command, fs: fs, fromEnv: fromEnv}
	if d.logger, d.level, err = newLogger(os.Stderr, *logLevel); err != nil {
		return nil, d.explain(err)
	}
	warnUnknownEnv(d.logger, command, unknown)
	return d, nil
}

// explain names, in an error about flags, the variables behind them.
func (d *daemonFlags) explain(err error) error {
	return cli.NameSource(err, d.fs, d.fromEnv, envFlagsExcluded...)
}

// checked ends --check-config: the refusal of the last checks, or the
// configuration printed.
func (d *daemonFlags) checked(check error) error {
	if check != nil {
		return d.explain(check)
	}
	return printCheckedConfig(os.Stdout, d.command, d.fs, d.fromEnv)
}
