package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
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
