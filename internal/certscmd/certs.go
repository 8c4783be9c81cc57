// Package certscmd is carve's `carve certs` commands: the cluster CA and
// its certificates (ca, issue), the record-signing key's rotation
// (rotate-signing), revocation (revoke), and the checks of a rotation's
// step against what the masters and their live agents report (check-ca,
// check-mesh).
package certscmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

const certsUsage = `usage:
  carve certs ca    --dir DIR [--days N]
  carve certs issue --dir DIR --role master|agent|operator --name NAME [--ip IP ...] [--dns NAME ...] [--days N]
  carve certs rotate-signing --dir DIR [--switch | --finish --masters URLS OPERATOR_TLS [--force]]
  carve certs revoke (--dir DIR --name NAME | --serial HEX [--identity ROLE/NAME]) --masters URLS OPERATOR_TLS
  carve certs check-ca --new-ca-file NEW/ca.pem --masters URLS OPERATOR_TLS
  carve certs check-mesh --password-file FILE [--accepted-file FILE] --masters URLS OPERATOR_TLS
`

// Run runs carve certs with args (the subcommand and its flags), printing
// on out: it creates the cluster CA and issues certificates (thin over
// pki), and checks and finishes the rotation steps against the masters.
func Run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: carve certs needs ca, issue, rotate-signing, revoke, check-ca or check-mesh\n%s", cli.ErrUsage, certsUsage)
	}
	switch args[0] {
	case "ca":
		return runCertsCA(args[1:], out)
	case "issue":
		return runCertsIssue(args[1:], out)
	case "rotate-signing":
		return runCertsRotateSigning(ctx, args[1:], out)
	case "revoke":
		return runCertsRevoke(ctx, args[1:], out)
	case "check-ca":
		return runCertsCheckCA(ctx, args[1:], out)
	case "check-mesh":
		return runCertsCheckMesh(ctx, args[1:], out)
	case "help", "-h", "--help":
		fmt.Fprint(out, certsUsage)
		return flag.ErrHelp
	}
	return fmt.Errorf("%w: carve certs %q: want ca, issue, rotate-signing, revoke, check-ca or check-mesh\n%s", cli.ErrUsage, args[0], certsUsage)
}

func runCertsCA(args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs ca")
	dir := fs.String("dir", "", "directory for the cluster CA (ca.pem, ca-key.pem) and the masters' record-signing key pair (signing.key, signing.pub); created if absent, never overwritten")
	days := fs.Int("days", 3650, fmt.Sprintf("validity of the CA certificate, in days (at most %d)", pki.MaxCADays))
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("%w: --dir is required", cli.ErrUsage)
	}
	if *days <= 0 || *days > pki.MaxCADays {
		return fmt.Errorf("%w: --days %d: want 1 to %d (the longest a CA may be valid)", cli.ErrUsage, *days, pki.MaxCADays)
	}
	if err := pki.CreateCA(*dir, time.Duration(*days)*24*time.Hour); err != nil {
		return err
	}
	fmt.Fprintf(out, "created the cluster CA in %s:\n", *dir)
	fmt.Fprintf(out, "  %s      the CA certificate: --ca-file of every master, agent and client\n", pki.CAFile)
	fmt.Fprintf(out, "  %s  the CA key: keep it offline, it issues certificates\n", pki.CAKey)
	fmt.Fprintf(out, "  %s  the masters' record-signing key: --signing-key-file of every master\n", pki.SignKey)
	fmt.Fprintf(out, "  %s  its public half, for agents\n", pki.SignPub)
	return nil
}

func runCertsIssue(args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs issue")
	dir := fs.String("dir", "", "directory of the cluster CA (made by carve certs ca); the certificate and key are written there as NAME.pem and NAME-key.pem")
	role := fs.String("role", "", "master, agent or operator: what the holder may do")
	name := fs.String("name", "", "the holder: a master's --id, an agent's agent id (it may register only that id), an operator's name")
	var ips, dnsNames listFlag
	fs.Var(&ips, "ip", "an IP address the holder serves on (repeat, or comma separate); a master needs those of its --http-addr and --raft-addr, an agent its underlay IP (the only IP it may register)")
	fs.Var(&dnsNames, "dns", "a DNS name the holder serves on (repeat, or comma separate)")
	days := fs.Int("days", 365, fmt.Sprintf("validity of the certificate, in days (at most %d)", pki.MaxCertDays))
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("%w: --dir is required", cli.ErrUsage)
	}
	r, err := pki.ParseRole(*role)
	if err != nil {
		return fmt.Errorf("%w: --role: %v", cli.ErrUsage, err)
	}
	if err := api.ValidateAgentID(*name); err != nil {
		return fmt.Errorf("%w: --name: %v", cli.ErrUsage, err)
	}
	if *days <= 0 || *days > pki.MaxCertDays {
		return fmt.Errorf("%w: --days %d: want 1 to %d (the longest a certificate may be valid; renew it before it expires)", cli.ErrUsage, *days, pki.MaxCertDays)
	}
	req := pki.IssueRequest{Role: r, Name: *name, DNSNames: dnsNames, Validity: time.Duration(*days) * 24 * time.Hour}
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return fmt.Errorf("%w: --ip %q is not an IP address", cli.ErrUsage, s)
		}
		req.IPs = append(req.IPs, ip.Unmap())
	}
	for _, d := range dnsNames {
		if d == "" || strings.ContainsAny(d, " /:") {
			return fmt.Errorf("%w: --dns %q is not a DNS name", cli.ErrUsage, d)
		}
	}
	if r == pki.RoleMaster && len(req.IPs) == 0 && len(req.DNSNames) == 0 {
		return fmt.Errorf("%w: a master's certificate needs --ip (or --dns) naming the addresses of its --http-addr and --raft-addr: clients and the other masters verify them", cli.ErrUsage)
	}
	if r == pki.RoleAgent && len(req.IPs) == 0 {
		return fmt.Errorf("%w: an agent's certificate needs --ip naming its underlay IP: the masters refuse a registration with an IP its certificate does not name", cli.ErrUsage)
	}
	if err := pki.Issue(*dir, req); err != nil {
		if errors.Is(err, pki.ErrExists) {
			return fmt.Errorf("%w: a certificate named %q is already issued (remove both files to issue it again)", err, *name)
		}
		return err
	}
	cert, err := pki.ReadCertificate(pki.CertFile(*dir, *name))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "issued %s/%s, serial %s, valid %d days: %s and %s\n", r, *name, pki.Serial(cert), *days,
		pki.CertFile(*dir, *name), pki.KeyFile(*dir, *name))
	return nil
}

// listFlag collects a repeatable, comma-separable flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
