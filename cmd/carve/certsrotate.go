package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

// runCertsRotateSigning replaces the masters' record-signing key and
// writes the chain link that lets agents follow it (docs/security.md,
// "Rotation").
func runCertsRotateSigning(args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs rotate-signing")
	dir := fs.String("dir", "", "directory of the cluster CA and the masters' record-signing key (made by carve certs ca)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("%w: --dir is required", cli.ErrUsage)
	}
	link, err := pki.RotateSigningKey(*dir)
	if err != nil {
		if errors.Is(err, pki.ErrExists) {
			return fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
		return err
	}
	prev, _ := api.ParseSigningKey(link.Previous) // RotateSigningKey made both
	next, _ := api.ParseSigningKey(link.Key)
	fmt.Fprintf(out, "rotated the masters' record-signing key in %s: %s -> %s\n", *dir, api.SigningKeyFingerprint(prev), api.SigningKeyFingerprint(next))
	fmt.Fprintf(out, "  %s, %s  the new key pair\n", pki.SignKey, pki.SignPub)
	fmt.Fprintf(out, "  %s  the new key endorsed by the old one: give it to every master (--signing-chain-file) with the new %s, then SIGHUP them one by one\n", pki.SignChain, pki.SignKey)
	fmt.Fprintf(out, "  %s, %s  the old pair: remove them, and the chain from the masters, once every agent follows the new key\n", pki.SignPreviousKey, pki.SignPreviousPub)
	return nil
}
