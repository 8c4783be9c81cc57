package main

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
)

// errAgentsOnOtherCA: a CA rotation's last step (the CA file the new CA
// alone) would cut off live agents, which still present a certificate of
// another CA.
var errAgentsOnOtherCA = errors.New("not every live agent presents a certificate of the new CA")

// runCertsCheckCA is the guard of a CA rotation's step 3 (docs/security.md,
// "Rotation"): it asks the masters which CA issued the certificate each
// live agent presents, and exits 0 only when every one is of the CA file
// step 3 installs.
func runCertsCheckCA(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs check-ca")
	newCA := fs.String("new-ca-file", "", "the CA file step 3 of a CA rotation installs (NEW/ca.pem): every live agent must present a certificate of a CA it holds")
	mf := addMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *newCA == "" {
		return fmt.Errorf("%w: --new-ca-file is required: the CA file step 3 installs (NEW/ca.pem of carve certs ca --dir NEW)", cli.ErrUsage)
	}
	if *mf.masters == "" {
		return fmt.Errorf("%w: --masters is required, with an operator certificate: only the leader knows which CA every live agent presents", cli.ErrUsage)
	}
	cas, err := readCAFingerprints(*newCA)
	if err != nil {
		return err
	}
	rep, err := askClusterStatus(ctx, mf, 10*time.Second)
	if err != nil {
		return err
	}
	var leader *api.ClusterStatus
	for _, v := range rep.Masters {
		if v.Status != nil && v.Status.Role == "leader" {
			leader = v.Status
		}
	}
	n, err := judgeAgentCAs(leader, *newCA, cas)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "every live agent (%d) presents a certificate of a CA of %s: step 3 (the CA file %s alone, SIGHUP everything) cuts none off\n", n, *newCA, *newCA)
	return nil
}

// readCAFingerprints reads the CA certificates of a PEM file, named by
// api.CAFingerprint.
func readCAFingerprints(path string) (map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--new-ca-file: %w", err)
	}
	cas := map[string]bool{}
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
		cas[api.CAFingerprint(cert.RawSubjectPublicKeyInfo)] = true
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
			t.otherCount, file, listed(t.other, t.otherCount)))
	}
	if t.unreportedCount > 0 {
		problems = append(problems, fmt.Sprintf("%d live agents whose certificate the leader %s has not seen yet: %s; an agent sends the leader a usage report at least every minute: retry in a minute",
			t.unreportedCount, leader.ID, listed(t.unreported, t.unreportedCount)))
	}
	if len(problems) > 0 {
		return t.live, fmt.Errorf("%w: %s", errAgentsOnOtherCA, strings.Join(problems, "; "))
	}
	return t.live, nil
}
