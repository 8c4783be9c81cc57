package main

// carve agent rotate-wireguard-key, and the encryption lines of carve state.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/carve-net/carve/agent/encryption"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
)

const rotateUsage = `usage:
  carve agent rotate-wireguard-key ID|IP... --masters URL[,URL...] [--agent-port PORT] [--timeout D] [--json] \
                      --ca-file CA --cert-file OPERATOR_CERT --key-file KEY | --insecure
Each named agent makes a new WireGuard key pair on its host and registers the public key;
its peers follow from its signed record. Prints each agent's new public key.
`

// rotatedAgent is one agent's outcome of a rotation.
type rotatedAgent struct {
	Name      string `json:"name"`
	AgentID   string `json:"agent_id,omitempty"`
	PublicKey string `json:"public_key,omitempty"`
	Error     string `json:"error,omitempty"`
}

func runRotateWireGuardKey(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve agent rotate-wireguard-key")
	asJSON := fs.Bool("json", false, "print the outcome as JSON")
	af := opclient.AddAgentFlags(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), rotateUsage); fs.PrintDefaults() }
	names, err := cli.ParseOperands(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: name the agents whose key to rotate (agent ids or underlay IPs)\n%s", cli.ErrUsage, rotateUsage)
	}
	client, reader, err := af.Cluster()
	if err != nil {
		return err
	}
	st, err := opclient.ReadState(ctx, client, *af.Timeout)
	if err != nil {
		return err
	}
	var rep []rotatedAgent
	failed := 0
	for _, n := range names {
		r := rotatedAgent{Name: n}
		if a := opclient.FindAgent(st, n); a == nil {
			r.Error = "no such agent in the masters' state"
		} else {
			r.AgentID = a.AgentID
			errs := reader.ReadAgents(ctx, []api.AgentInfo{*a}, func(ctx context.Context, c *api.AgentClient, _ api.AgentInfo) error {
				ws, err := c.RotateWireGuardKey(ctx)
				if err == nil {
					r.PublicKey = ws.RegisteredKey
				}
				return err
			})
			r.Error = errs[a.AgentID]
		}
		if r.Error != "" {
			failed++
		}
		rep = append(rep, r)
	}
	if err := cli.PrintReport(out, *asJSON, rep, printRotations); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d agents not rotated", failed, len(rep))
	}
	return nil
}

// printRotations prints one line per named agent: its new public key, or
// why it was not rotated.
func printRotations(out io.Writer, rep []rotatedAgent) error {
	for _, r := range rep {
		if r.Error != "" {
			fmt.Fprintf(out, "%s: not rotated: %s\n", r.Name, r.Error)
		} else {
			fmt.Fprintf(out, "%s: rotated, public key %s\n", r.AgentID, r.PublicKey)
		}
	}
	return nil
}

// printEncryption says, when the network encrypts, which agents have no
// WireGuard key in their record: the cleartext (or, strict, unreachable)
// ones of a rolling enable.
func printEncryption(out io.Writer, st *api.State) {
	if st.Network.Encryption == "" {
		return
	}
	var without []string
	for _, a := range st.Agents {
		if a.Keys.WireGuard == "" {
			without = append(without, a.AgentID)
		}
	}
	what := api.PeerCleartext
	if st.Network.Encryption == api.EncryptionWireGuardStrict {
		what = "unreachable"
	}
	fmt.Fprintf(out, "encryption %s: %d of %d agents keyed", st.Network.Encryption, len(st.Agents)-len(without), len(st.Agents))
	if len(without) > 0 {
		fmt.Fprintf(out, "; without a key (%s): %s", what, strings.Join(without, " "))
	}
	fmt.Fprintln(out)
}

// wireGuardFlagSet holds the agent's WireGuard flags.
type wireGuardFlagSet struct {
	enabled   *bool
	device    *string
	userspace *bool
	rotate    *time.Duration
}

func wireGuardFlags(fs *flag.FlagSet) *wireGuardFlagSet {
	return &wireGuardFlagSet{
		enabled:   fs.Bool("wireguard", true, "make a WireGuard key pair on this host (private key in --data-dir, mode 0600) and register its public key, for when the network configuration turns encryption on; false: none, and peers treat this agent as one without a key"),
		device:    fs.String("wireguard-device", encryption.DefaultDevice, "name of the WireGuard interface the agent creates while encryption is on (with userspace WireGuard its socket is /var/run/wireguard/NAME.sock: hosts sharing a file system need distinct names)"),
		userspace: fs.Bool("wireguard-userspace", false, "run WireGuard in the agent (wireguard-go) even when the kernel has the module (the agent falls back to it by itself when the kernel has none)"),
		rotate:    fs.Duration("wireguard-key-rotation", 0, "rotate the WireGuard key this often (e.g. 720h); 0: only on request (carve agent rotate-wireguard-key)"),
	}
}

// config checks the flags and returns the agent's WireGuard configuration.
func (f *wireGuardFlagSet) config() (encryption.Config, error) {
	if err := api.ValidateIfName(*f.device); err != nil {
		return encryption.Config{}, fmt.Errorf("%w: --wireguard-device: %v", cli.ErrUsage, err)
	}
	if *f.rotate < 0 || (*f.rotate > 0 && *f.rotate < time.Minute) {
		return encryption.Config{}, fmt.Errorf("%w: --wireguard-key-rotation %s: want 0 (on request only) or at least 1m", cli.ErrUsage, *f.rotate)
	}
	return encryption.Config{Disabled: !*f.enabled, Device: *f.device, Userspace: *f.userspace, RotateEvery: *f.rotate}, nil
}
