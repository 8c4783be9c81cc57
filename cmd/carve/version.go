package main

import (
	"fmt"
	"io"

	"github.com/carve-net/carve/internal/buildinfo"
	"github.com/carve-net/carve/internal/cli"
)

// runVersion prints this build of carve: version, commit, Go version and
// build date.
func runVersion(args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve version")
	asJSON := fs.Bool("json", false, "print the build as JSON")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	info := buildinfo.Get()
	if *asJSON {
		return cli.WriteJSON(out, info)
	}
	_, err := fmt.Fprintln(out, info.String())
	return err
}
