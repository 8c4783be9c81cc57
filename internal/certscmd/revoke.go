package certscmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/pki"
)

const revokeUsage = `usage:
  carve certs revoke --dir DIR --name NAME          --masters URLS OPERATOR_TLS
  carve certs revoke --serial HEX [--identity ROLE/NAME] --masters URLS OPERATOR_TLS
`

// runCertsRevoke puts a certificate on the masters' deny list: by name
// (the certificate NAME.pem that carve certs issue wrote in --dir gives
// its serial, role and expiry) or by serial.
func runCertsRevoke(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs revoke")
	dir := fs.String("dir", "", "directory of the cluster CA where carve certs issue wrote NAME.pem (with --name)")
	name := fs.String("name", "", "the certificate to revoke, by the name it was issued with (reads DIR/NAME.pem)")
	serial := fs.String("serial", "", "the certificate to revoke, by serial number in hex (carve certs issue and openssl x509 -serial print it), when its file is gone")
	identity := fs.String("identity", "", "with --serial: the certificate's ROLE/NAME (agent/h1, say); for an agent the masters also delete its record")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the masters")
	mf := opclient.AddMasterFlags(fs, "an operator certificate (carve certs issue --role operator --name NAME): the masters refuse revocations from other roles")
	fs.Usage = func() { fmt.Fprint(fs.Output(), revokeUsage); fs.PrintDefaults() }
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	req, err := revokeRequest(*dir, *name, *serial, *identity)
	if err != nil {
		return err
	}
	client, _, err := mf.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	ans, err := client.Revoke(ctx, req)
	if err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	what := "serial " + req.Serial
	if req.Identity != "" {
		what = req.Identity + " (" + what + ")"
	}
	fmt.Fprintf(out, "revoked %s: the masters refuse it on the API and on Raft; %d certificate(s) on the deny list\n", what, len(ans.Revoked))
	for _, id := range ans.Deleted {
		fmt.Fprintf(out, "deleted agent %s: it cannot register again with this certificate\n", id)
	}
	return nil
}

// revokeRequest builds the request from the flags: --name reads the issued
// certificate in --dir, --serial takes the serial as given.
func revokeRequest(dir, name, serial, identity string) (api.RevokeRequest, error) {
	switch {
	case (name == "") == (serial == ""):
		return api.RevokeRequest{}, fmt.Errorf("%w: give --name (with --dir) or --serial\n%s", cli.ErrUsage, revokeUsage)
	case serial != "":
		s, err := api.CanonicalSerial(serial)
		if err != nil {
			return api.RevokeRequest{}, fmt.Errorf("%w: --serial: %v", cli.ErrUsage, err)
		}
		return api.RevokeRequest{Serial: s, Identity: identity}, nil
	case dir == "":
		return api.RevokeRequest{}, fmt.Errorf("%w: --name needs --dir, the directory carve certs issue wrote %s.pem in", cli.ErrUsage, name)
	case identity != "":
		return api.RevokeRequest{}, fmt.Errorf("%w: --identity goes with --serial; --name reads it from the certificate", cli.ErrUsage)
	}
	path := pki.CertFile(dir, name)
	cert, err := pki.ReadCertificate(path)
	if err != nil {
		return api.RevokeRequest{}, fmt.Errorf("--name %s: %w (revoke by --serial when the file is gone)", name, err)
	}
	id, err := pki.IdentityOf(cert)
	if err != nil {
		if errors.Is(err, pki.ErrNoIdentity) {
			return api.RevokeRequest{}, fmt.Errorf("--name %s: %s is not a carve certificate: %w", name, path, err)
		}
		return api.RevokeRequest{}, err
	}
	return api.RevokeRequest{Serial: pki.Serial(cert), Identity: id.String(), NotAfter: cert.NotAfter.Unix()}, nil
}
