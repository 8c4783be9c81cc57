package certscmd

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/pki"
)

// errAgentsOnOtherCA: a CA rotation's last step (the CA file the new CA
// alone) would cut off live agents, which still present a certificate of
// another CA.
var errAgentsOnOtherCA = errors.New("not every live agent presents a certificate of the new CA")

// errOnOtherCA: a CA rotation's last step would cut off a master, this
// operator or a live agent, whose certificate is of another CA.
var errOnOtherCA = errors.New("not every certificate in use is of the new CA")

// runCertsCheckCA is the guard of a CA rotation's step 3 (docs/security.md,
// "Rotation"): it asks the masters which CA issued the certificate each
// live agent presents, and exits 0 only when every one is of the CA file
// step 3 installs.
func runCertsCheckCA(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs check-ca")
	newCA := fs.String("new-ca-file", "", "the CA file step 3 of a CA rotation installs (NEW/ca.pem): every live agent must present a certificate of a CA it holds")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *newCA == "" {
		return fmt.Errorf("%w: --new-ca-file is required: the CA file step 3 installs (NEW/ca.pem of carve certs ca --dir NEW)", cli.ErrUsage)
	}
	if *mf.Masters == "" {
		return fmt.Errorf("%w: --masters is required, with an operator certificate: only the leader knows which CA every live agent presents", cli.ErrUsage)
	}
	newCAs, err := readCAs(*newCA)
	if err != nil {
		return err
	}
	cas := map[string]bool{}
	for _, ca := range newCAs {
		cas[api.CAFingerprint(ca.RawSubjectPublicKeyInfo)] = true
	}
	masters, err := opclient.AskMasters(ctx, mf, 10*time.Second)
	if err != nil {
		return err
	}
	var leader *api.ClusterStatus
	for _, v := range masters {
		if v.Status != nil && v.Status.Role == "leader" {
			leader = v.Status
		}
	}
	// Step 3 cuts off every certificate of another CA: the masters' (each
	// says which CA issued its own), this operator's, and the agents'.
	problems := judgeMasterCAs(masters, *newCA, cas)
	if p := judgeOwnCA(mf.TLS.Cert, *newCA, newCAs); p != "" {
		problems = append(problems, p)
	}
	n, err := judgeAgentCAs(leader, *newCA, cas)
	if err != nil {
		problems = append(problems, strings.TrimPrefix(err.Error(), errAgentsOnOtherCA.Error()+": "))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", errOnOtherCA, strings.Join(problems, "; "))
	}
	fmt.Fprintf(out, "every master (%d), this operator and every live agent (%d) present a certificate of a CA of %s: step 3 (the CA file %s alone, SIGHUP everything) cuts none off; "+
		"other operators' certificates must be of it too\n", len(masters), n, *newCA, *newCA)
	return nil
}

// judgeMasterCAs names the masters whose certificate is not of the new CA
// (cas, read from file), or that cannot say.
func judgeMasterCAs(views []opclient.MasterView, file string, cas map[string]bool) []string {
	var other, unknown []string
	for _, v := range views {
		switch {
		case v.Status == nil:
			unknown = append(unknown, fmt.Sprintf("%s (no answer: %s)", v.URL, v.Error))
		case v.Status.CertificateCA == "":
			unknown = append(unknown, fmt.Sprintf("%s (it predates this check: upgrade the masters first)", v.Status.ID))
		case !cas[v.Status.CertificateCA]:
			other = append(other, fmt.Sprintf("%s (CA %.16s)", v.Status.ID, v.Status.CertificateCA))
		}
	}
	var problems []string
	if len(other) > 0 {
		problems = append(problems, fmt.Sprintf("%d masters present a certificate of another CA than %s: %s; step 3 would cut them off from each other and from every agent: "+
			"re-issue their certificates with carve certs issue --dir NEW --role master (same name and --ip), install them and SIGHUP the masters (step 2), then check again",
			len(other), file, strings.Join(other, ", ")))
	}
	if len(unknown) > 0 {
		problems = append(problems, fmt.Sprintf("%d masters do not say which CA issued their certificate: %s; retry once every master answers", len(unknown), strings.Join(unknown, ", ")))
	}
	return problems
}

// judgeOwnCA says why this operator's certificate (--cert-file) is not of
// a CA of the new CA file, "" when it is.
func judgeOwnCA(certFile, file string, newCAs []*x509.Certificate) string {
	if certFile == "" {
		return ""
	}
	leaf, err := pki.ReadCertificate(certFile)
	if err != nil {
		return fmt.Sprintf("this operator's --cert-file: %v", err)
	}
	for _, ca := range newCAs {
		if leaf.CheckSignatureFrom(ca) == nil {
			return ""
		}
	}
	return fmt.Sprintf("this operator's certificate --cert-file %s is not of a CA of %s: after step 3 the masters refuse it; issue operators new certificates (carve certs issue --dir NEW --role operator)", certFile, file)
}

// readCAs reads the CA certificates of a PEM file.
func readCAs(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--new-ca-file: %w", err)
	}
	var cas []*x509.Certificate
	for rest := data; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("--new-ca-file %s: %w", path, err)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("--new-ca-file %s: %q is not a CA certificate: give the new CA's ca.pem (carve certs ca --dir NEW)", path, cert.Subject.CommonName)
		}
		cas = append(cas, cert)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("--new-ca-file %s holds no PEM certificate: give the new CA's ca.pem (carve certs ca --dir NEW)", path)
	}
	return cas, nil
}

// judgeAgentCAs checks the leader's status: every live agent presents a
// certificate of one of cas (read from file), and returns how many there
// are. The error names those on another CA, or not seen yet, and the fix.
func judgeAgentCAs(leader *api.ClusterStatus, file string, cas map[string]bool) (int, error) {
	t, err := tallyAgentGroups(leader, errAgentsOnOtherCA, "does not say which CA their certificates come from: it runs --insecure (no certificates: nothing to check), or predates this check (upgrade the masters first)",
		func(tr *api.AgentTrust) []agentGroup {
			var groups []agentGroup
			for _, g := range tr.ByCA {
				groups = append(groups, agentGroup{count: g.Count, agents: g.Agents, accepted: cas[g.CA], unreported: g.CA == "", label: fmt.Sprintf("CA %.16s", g.CA)})
			}
			return groups
		})
	if err != nil || t.live == 0 {
		return 0, err
	}
	var problems []string
	if t.otherCount > 0 {
		problems = append(problems, fmt.Sprintf("%d live agents present a certificate of another CA than %s: %s; step 3 would cut them off (every master refuses them): "+
			"re-issue their certificates with carve certs issue --dir NEW (same name and --ip), install them and SIGHUP the agents (step 2), then check again",
			t.otherCount, file, cli.Listed(t.other, t.otherCount)))
	}
	if t.unreportedCount > 0 {
		problems = append(problems, fmt.Sprintf("%d live agents whose certificate the leader %s has not seen yet: %s; an agent sends the leader a usage report at least every minute: retry in a minute",
			t.unreportedCount, leader.ID, cli.Listed(t.unreported, t.unreportedCount)))
	}
	if len(problems) > 0 {
		return t.live, fmt.Errorf("%w: %s", errAgentsOnOtherCA, strings.Join(problems, "; "))
	}
	return t.live, nil
}
