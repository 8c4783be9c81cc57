package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

// runCertsRotateSigning takes the masters' record-signing key through a
// rotation, one step a call (docs/security.md, "Rotation").
func runCertsRotateSigning(args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs rotate-signing")
	dir := fs.String("dir", "", "directory of the cluster CA and the masters' record-signing key (made by carve certs ca)")
	doSwitch := fs.Bool("switch", false, "step 2: make the new key (signing-next.key) the signing key; the old one moves to signing-previous.key")
	finish := fs.Bool("finish", false, "step 3: remove the chain and the previous key pair")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("%w: --dir is required", cli.ErrUsage)
	}
	if *doSwitch && *finish {
		return fmt.Errorf("%w: --switch and --finish are two steps: give one", cli.ErrUsage)
	}
	var err error
	switch {
	case *doSwitch:
		if err = pki.SwitchSigningKey(*dir); err == nil {
			fmt.Fprintf(out, "step 2 done in %s: %s is the new key (the old one is %s)\n", *dir, pki.SignKey, pki.SignPreviousKey)
			fmt.Fprintf(out, "  give every master the new %s and SIGHUP them one by one: agents follow the chain, with no restart\n", pki.SignKey)
			fmt.Fprintf(out, "  then: carve certs rotate-signing --dir %s --finish\n", *dir)
		}
	case *finish:
		if err = pki.FinishSigningRotation(*dir); err == nil {
			fmt.Fprintf(out, "step 3 done in %s: the chain and the previous key pair are removed\n", *dir)
			fmt.Fprintf(out, "  remove %s from every master and SIGHUP them; give agents that run with --signing-pub-file the new %s (read at their next start)\n", pki.SignChain, pki.SignPub)
		}
	default:
		var link api.SigningLink
		if link, err = pki.BeginSigningRotation(*dir); err == nil {
			prev, _ := api.ParseSigningKey(link.Previous) // BeginSigningRotation made both
			next, _ := api.ParseSigningKey(link.Key)
			fmt.Fprintf(out, "step 1 done in %s: a new record-signing key %s, endorsed by the current one %s\n", *dir, api.SigningKeyFingerprint(next), api.SigningKeyFingerprint(prev))
			fmt.Fprintf(out, "  %s, %s  the new key pair\n", pki.SignNextKey, pki.SignNextPub)
			fmt.Fprintf(out, "  %s  the chain: give it to every master (their --signing-chain-file) and SIGHUP them one by one\n", pki.SignChain)
			fmt.Fprintf(out, "  then: carve certs rotate-signing --dir %s --switch\n", *dir)
		}
	}
	if errors.Is(err, pki.ErrRotation) {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	return err
}
