package certscmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
)

// errAgentsOnOtherMeshRound: a round of a mesh password change is not
// finished everywhere: live agents send, or accept, other passwords than
// the round's files. Going on to the next round would cut them off.
var errAgentsOnOtherMeshRound = errors.New("not every live agent holds this round's mesh passwords")

// meshRound is what every agent holds at the end of a round of a mesh
// password change: the fingerprints (api.MeshPasswordFingerprint) of the
// password sent and of the one accepted besides ("": none), and the files
// they were read from, to name them.
type meshRound struct {
	password, accepted         string
	passwordFile, acceptedFile string
}

// runCertsCheckMesh is the guard at the end of each round of a mesh
// password change (docs/security.md, "Rotation"): it asks the masters
// which mesh passwords each live agent reports, and exits 0 only when
// every one sends the password of --password-file and accepts that of
// --accepted-file besides (none when the flag is absent or the file
// empty), so that the next round cuts none off.
func runCertsCheckMesh(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs check-mesh")
	passwordFile := fs.String("password-file", "", "the mesh password file this round gave every agent (their --mesh-password-file): every live agent must send that password")
	acceptedFile := fs.String("accepted-file", "", "the accepted password file this round gave every agent (their --mesh-accepted-password-file): every live agent must accept that password besides; absent or empty: none")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *passwordFile == "" {
		return fmt.Errorf("%w: --password-file is required: the mesh password file the round just finished gave every agent", cli.ErrUsage)
	}
	if *mf.Masters == "" {
		return fmt.Errorf("%w: --masters is required, with an operator certificate: only the leader knows which mesh passwords every live agent reports", cli.ErrUsage)
	}
	round, err := readMeshRound(*passwordFile, *acceptedFile)
	if err != nil {
		return err
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
	n, err := judgeAgentMesh(leader, round)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "every live agent (%d) %s: this round is finished everywhere, the next one cuts none off\n", n, round.describe(round.password, round.accepted))
	return nil
}

// readMeshRound reads the round's files as the agent reads them
// (gossip.ReadPasswordFile, gossip.ReadAcceptedPasswordFile), into their
// fingerprints.
func readMeshRound(passwordFile, acceptedFile string) (meshRound, error) {
	round := meshRound{passwordFile: passwordFile, acceptedFile: acceptedFile}
	password, err := gossip.ReadPasswordFile(passwordFile)
	if err != nil {
		return round, fmt.Errorf("--password-file: %w", err)
	}
	round.password = api.MeshPasswordFingerprint(password)
	if acceptedFile != "" {
		accepted, err := gossip.ReadAcceptedPasswordFile(acceptedFile)
		if err != nil {
			return round, fmt.Errorf("--accepted-file: %w", err)
		}
		round.accepted = api.MeshPasswordFingerprint(accepted)
	}
	return round, nil
}

// name is a fingerprint as the operator knows it: the file of the round
// holding that password, else the fingerprint.
func (r meshRound) name(fp string) string {
	switch fp {
	case r.password:
		return "the password of " + r.passwordFile
	case r.accepted:
		return "the password of " + r.acceptedFile
	}
	return "password " + fp
}

// describe says what an agent reporting the pair (password, accepted)
// holds.
func (r meshRound) describe(password, accepted string) string {
	s := "sends " + r.name(password)
	if accepted == "" {
		return s + " and accepts no other"
	}
	return s + " and accepts " + r.name(accepted) + " besides"
}

// judgeAgentMesh checks the leader's status: every live agent reports the
// round's pair of mesh passwords, and returns how many there are. The
// error names those on another pair, or reporting none, and the fix.
func judgeAgentMesh(leader *api.ClusterStatus, round meshRound) (int, error) {
	t, err := tallyAgentGroups(leader, errAgentsOnOtherMeshRound, "none reports a mesh password: they run without --mesh-password-file (nothing to check), or they or the masters predate this check (upgrade them first)",
		func(tr *api.AgentTrust) []agentGroup {
			var groups []agentGroup
			for _, g := range tr.ByMesh {
				groups = append(groups, agentGroup{count: g.Count, agents: g.Agents, accepted: g.Password == round.password && g.Accepted == round.accepted,
					unreported: g.Password == "", label: round.describe(g.Password, g.Accepted)})
			}
			return groups
		})
	if err != nil || t.live == 0 {
		return 0, err
	}
	var problems []string
	if t.otherCount > 0 {
		fix := "--mesh-password-file holding " + round.passwordFile + "'s password"
		if round.accepted != "" {
			fix += " and --mesh-accepted-password-file holding " + round.acceptedFile + "'s"
		} else {
			fix += " and --mesh-accepted-password-file empty (or unset)"
		}
		problems = append(problems, fmt.Sprintf("%d live agents are not on this round, which %s: %s; the next round would cut them off from gossip: "+
			"give them this round's files (%s) and SIGHUP them (kill -HUP), then check again",
			t.otherCount, round.describe(round.password, round.accepted), cli.Listed(t.other, t.otherCount), fix))
	}
	if t.unreportedCount > 0 {
		problems = append(problems, fmt.Sprintf("%d live agents report no mesh password to the leader %s: %s; they run without --mesh-password-file, predate this report (upgrade them), or have not reported since they started: retry in a minute",
			t.unreportedCount, leader.ID, cli.Listed(t.unreported, t.unreportedCount)))
	}
	if len(problems) > 0 {
		return t.live, fmt.Errorf("%w: %s", errAgentsOnOtherMeshRound, strings.Join(problems, "; "))
	}
	return t.live, nil
}
