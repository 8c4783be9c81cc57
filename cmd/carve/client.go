package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

// masterFlags are the flags of a command that talks to the masters:
// --masters, --ca-file, --cert-file, --key-file and --insecure.
type masterFlags struct {
	masters  *string
	tls      *pki.Files
	insecure *bool
}

// addMasterFlags defines the flags; certHelp says which certificate
// --cert-file must be.
func addMasterFlags(fs *flag.FlagSet, certHelp string) *masterFlags {
	return &masterFlags{
		masters:  fs.String("masters", "", "master URLs, comma separated"),
		tls:      tlsFlags(fs, certHelp),
		insecure: fs.Bool("insecure", false, "talk to masters (and agents) that run --insecure (plain HTTP, no certificate)"),
	}
}

// client checks the flags and returns a client for the masters and the
// options it was made with, for more clients alike (TLS is nil with
// --insecure).
func (f *masterFlags) client() (*api.Client, api.ClientOptions, error) {
	var opts api.ClientOptions
	urls, err := splitMasters(*f.masters)
	if err != nil {
		return nil, opts, err
	}
	if err := checkSecurityFlags(*f.tls, *f.insecure, true); err != nil {
		return nil, opts, err
	}
	if !*f.insecure {
		if opts.TLS, err = f.tls.ClientConfig(); err != nil {
			return nil, opts, err
		}
		opts.TLS.VerifyConnection = requireMaster
	}
	c, err := api.NewClientWith(urls, opts)
	if err != nil {
		return nil, opts, fmt.Errorf("%w: --masters: %v", cli.ErrUsage, err)
	}
	return c, opts, nil
}

// subcommand runs the subcommand that args[0] names.
func subcommand(name, usage string, args []string, out io.Writer, subs map[string]func(args []string) error) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s needs a subcommand\n%s", cli.ErrUsage, name, usage)
	}
	if run, ok := subs[args[0]]; ok {
		return run(args[1:])
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(out, usage)
		return flag.ErrHelp
	}
	return fmt.Errorf("%w: %s %q: unknown subcommand\n%s", cli.ErrUsage, name, args[0], usage)
}

// printReport prints a command's report: as JSON with --json, else as the
// command's table.
func printReport[R any](out io.Writer, asJSON bool, rep R, table func(io.Writer, R) error) error {
	if asJSON {
		return writeJSON(out, rep)
	}
	return table(out, rep)
}

// writeJSON prints v indented, as every --json does.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
