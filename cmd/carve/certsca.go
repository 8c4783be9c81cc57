package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
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
	if leader == nil {
		return 0, fmt.Errorf("%w: no master leads, and only the leader knows which agents are live; retry once one does", errAgentsOnOtherCA)
	}
	var byCA []api.AgentCA
	if leader.AgentTrust != nil {
		byCA = leader.AgentTrust.ByCA
	}
	if len(byCA) == 0 {
		agents := 0
		for _, n := range leader.AgentVersions {
			agents += n
		}
		if agents > len(leader.SilentAgents) {
			return 0, fmt.Errorf("%w: the leader %s has live agents but does not say which CA their certificates come from: it runs --insecure (no certificates: nothing to check), or predates this check (upgrade the masters first)", errAgentsOnOtherCA, leader.ID)
		}
		return 0, nil
	}
	live := 0
	var other, unseen []string
	otherCount, unseenCount := 0, 0
	for _, g := range byCA {
		live += g.Count
		switch {
		case cas[g.CA]:
		case g.CA == "":
			unseenCount += g.Count
			unseen = append(unseen, g.Agents...)
		default:
			otherCount += g.Count
			for _, a := range g.Agents {
				other = append(other, fmt.Sprintf("%s (CA %.16s)", a, g.CA))
			}
		}
	}
	var problems []string
	if otherCount > 0 {
		slices.Sort(other)
		problems = append(problems, fmt.Sprintf("%d live agents present a certificate of another CA than %s: %s; step 3 would cut them off (every master refuses them): "+
			"re-issue their certificates with carve certs issue --dir NEW (same name and --ip), install them and SIGHUP the agents (step 2), then check again",
			otherCount, file, listed(other, otherCount)))
	}
	if unseenCount > 0 {
		slices.Sort(unseen)
		problems = append(problems, fmt.Sprintf("%d live agents whose certificate the leader %s has not seen yet: %s; an agent sends the leader a usage report at least every minute: retry in a minute",
			unseenCount, leader.ID, listed(unseen, unseenCount)))
	}
	if len(problems) > 0 {
		return live, fmt.Errorf("%w: %s", errAgentsOnOtherCA, strings.Join(problems, "; "))
	}
	return live, nil
}
