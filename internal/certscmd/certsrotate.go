package certscmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/pki"
)

// runCertsRotateSigning takes the masters' record-signing key through a
// rotation, one step a call (docs/security.md, "Rotation").
func runCertsRotateSigning(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve certs rotate-signing")
	dir := fs.String("dir", "", "directory of the cluster CA and the masters' record-signing key (made by carve certs ca)")
	doSwitch := fs.Bool("switch", false, "step 2: make the new key (signing-next.key) the signing key; the old one moves to signing-previous.key")
	finish := fs.Bool("finish", false, "step 3: remove the chain and the previous key pair, once every master signs with the new key and every live agent reports verifying with it (asked of --masters)")
	force := fs.Bool("force", false, "with --finish: finish without asking the masters, or although agents do not report the new key yet (they are stranded: give them the new signing.pub and restart them)")
	mf := opclient.AddMasterFlags(fs, "with --finish: a certificate of role operator (carve certs issue --role operator --name NAME)")
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
		if *force {
			fmt.Fprintln(out, "--force: finishing without checking that every agent verifies with the new key")
		} else if err = checkAgentsOnKey(ctx, *dir, mf); err != nil {
			break
		}
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

// errAgentsBehind: a signing-key rotation's finish that would strand
// agents (or masters) not on the new key yet.
var errAgentsBehind = errors.New("not every master and agent is on the new signing key")

// checkAgentsOnKey asks the masters whether the rotation in dir may be
// finished: every master that answers signs with the new key (signing.pub
// in dir) and the leader sees every live agent report verifying with it.
// Dropping the chain before would strand the others: they refuse the
// masters until given the new signing.pub and restarted.
func checkAgentsOnKey(ctx context.Context, dir string, mf *opclient.MasterFlags) error {
	if *mf.Masters == "" {
		return fmt.Errorf("%w: --finish asks the masters whether every agent verifies with the new key: give --masters and an operator certificate (or --force, which may strand agents)", cli.ErrUsage)
	}
	pub, err := pki.LoadVerifyKey(filepath.Join(dir, pki.SignPub))
	if err != nil {
		return err
	}
	key := api.EncodeSigningKey(pub)
	masters, err := opclient.AskMasters(ctx, mf, 10*time.Second)
	if err != nil {
		return err
	}
	var leader *api.ClusterStatus
	var behind []string
	for _, v := range masters {
		switch {
		case v.Status == nil:
			behind = append(behind, fmt.Sprintf("%s (no answer: %s)", v.URL, v.Error))
		case v.Status.SigningKey != key:
			behind = append(behind, fmt.Sprintf("%s (%s)", v.Status.ID, keyName(v.Status.SigningKey)))
		}
		if v.Status != nil && v.Status.Role == "leader" {
			leader = v.Status
		}
	}
	if len(behind) > 0 {
		return fmt.Errorf("%w: masters that do not sign with the new key %s: %s; give every master the new %s and SIGHUP it, then finish (--force finishes anyway)",
			errAgentsBehind, api.SigningKeyFingerprint(pub), strings.Join(behind, ", "), pki.SignKey)
	}
	if leader == nil {
		return fmt.Errorf("%w: no master leads, and only the leader knows which agents are live; retry once one does (--force finishes anyway)", errAgentsBehind)
	}
	if tr := leader.AgentTrust; tr != nil && tr.OtherKeyCount > 0 {
		return fmt.Errorf("%w: %d live agents do not report verifying with the new key %s yet: %s; "+
			"while the masters serve %s agents follow it within seconds: wait and retry; an agent that stays behind refuses the masters (its log, carve_agent_refusing_masters): "+
			"give it the new %s and restart it, or stop it (silent agents are not counted after %s); --force finishes anyway and strands them",
			errAgentsBehind, tr.OtherKeyCount, api.SigningKeyFingerprint(pub), agentsOffKey(tr), pki.SignChain, pki.SignPub, leader.SilentAfter)
	}
	return nil
}

// keyName is a signing key as a status reports it, for a message.
func keyName(s string) string {
	k, err := api.ParseSigningKey(s)
	if err != nil {
		return "signs with no key it reports"
	}
	return "signs with " + api.SigningKeyFingerprint(k)
}
