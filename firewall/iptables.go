package firewall

// The iptables side: which binaries a host has, what their -save prints,
// and the -restore scripts that change carve's chains.

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// sbinDirs are searched after PATH: Debian puts iptables in /usr/sbin, which
// a PATH of a user other than root may lack.
var sbinDirs = []string{"/usr/sbin", "/sbin"}

func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range sbinDirs {
		p := filepath.Join(d, name)
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}

// runTimeout bounds one run of an iptables binary.
const runTimeout = 30 * time.Second

// tool is one backend of one family on this host: its -save and -restore.
type tool struct {
	backend       Backend
	save, restore string
	broken        bool // its -save failed this time
}

// program is the family's iptables command.
func (fam Family) program() string {
	if fam == IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// tools finds the backends of fam: the -nft and -legacy binaries (Debian's
// iptables package has both), else the plain ones, whose backend their
// version says.
func (f *Forward) tools(ctx context.Context, fam Family) ([]tool, error) {
	prog := fam.program()
	var out []tool
	var looked []string
	for _, b := range []Backend{NFT, Legacy} {
		save, restore := prog+"-"+string(b)+"-save", prog+"-"+string(b)+"-restore"
		looked = append(looked, save)
		ps, err1 := f.lookPath(save)
		pr, err2 := f.lookPath(restore)
		if err1 == nil && err2 == nil {
			out = append(out, tool{backend: b, save: ps, restore: pr})
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	looked = append(looked, prog+"-save")
	ps, err1 := f.lookPath(prog + "-save")
	pr, err2 := f.lookPath(prog + "-restore")
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("firewall: %w for %s (looked for %s in PATH, %s): install iptables (Debian: apt-get install iptables)",
			ErrNoIptables, fam, strings.Join(looked, ", "), strings.Join(sbinDirs, ", "))
	}
	v, err := f.run(ctx, "", ps, "--version")
	if err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	b := Legacy
	if strings.Contains(v, "nf_tables") {
		b = NFT
	}
	return []tool{{backend: b, save: ps, restore: pr}}, nil
}

// run runs an iptables binary inside the namespace, with stdin, and
// returns what it printed; an error carries what it said on stderr.
func (f *Forward) run(ctx context.Context, stdin, name string, args ...string) (string, error) {
	// -w waits for the xtables lock without end; another user holding it
	// that long fails this run, retried at the next reconcile.
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := f.inNS(cmd.Run); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return "", fmt.Errorf("%s %s: %w", filepath.Base(name), strings.Join(args, " "), err)
		}
		return "", fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

// filterState is what one -save showed: carve's chains and jumps, and how
// much of the ruleset is someone else's.
type filterState struct {
	// foreign counts the rules of others (any table) and the built-in
	// chains whose policy is not ACCEPT: a backend in use holds some.
	foreign int
	// policy is FORWARD's policy ("" when the filter table is absent).
	policy string
	// jumps are the positions, from 0, of the rules of FORWARD that jump
	// to Chain.
	jumps []int
	// chains are carve's chains present, rules their rules in order.
	chains []string
	rules  []string
}

// parseSave reads the output of iptables-save.
func parseSave(out string) filterState {
	var st filterState
	table := ""
	forward := 0
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || line == "COMMIT":
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				continue
			}
			if table == "filter" && (f[0] == Chain || f[0] == OutChain) {
				st.chains = append(st.chains, f[0])
				continue
			}
			if table == "filter" && f[0] == "FORWARD" {
				st.policy = f[1]
			}
			if f[1] != "-" && f[1] != "ACCEPT" {
				st.foreign++
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			switch {
			case table == "filter" && f[1] == "FORWARD":
				if line == jumpRule {
					st.jumps = append(st.jumps, forward)
				} else {
					st.foreign++
				}
				forward++
			case table == "filter" && (f[1] == Chain || f[1] == OutChain):
				st.rules = append(st.rules, line)
			default:
				st.foreign++
			}
		}
	}
	return st
}

// jumpRule is carve's rule in FORWARD, as -save prints it.
const jumpRule = "-A FORWARD -j " + Chain

// ours tells whether anything of carve's is there.
func (st filterState) ours() bool { return len(st.chains) > 0 || len(st.jumps) > 0 }

// inSync tells whether the rules are want, jumped to by the first rule of
// FORWARD only.
func (st filterState) inSync(want []string) bool {
	return len(st.chains) == 2 && slices.Equal(st.rules, want) && slices.Equal(st.jumps, []int{0})
}

// describe says what was found, for the log of a repair.
func (st filterState) describe() string {
	switch {
	case len(st.chains) < 2:
		return "chains missing"
	case len(st.jumps) == 0:
		return "no jump from FORWARD"
	case st.jumps[0] != 0:
		return fmt.Sprintf("jump from FORWARD at position %d, not first", st.jumps[0]+1)
	case len(st.jumps) > 1:
		return "more than one jump from FORWARD"
	default:
		return "rules differ"
	}
}

// desiredRules are the rules of carve's chains for devices (sorted, each
// once), as -save prints them: a packet in on a device goes on to
// OutChain, which accepts it when it goes out on a device.
func desiredRules(devices []string) ([]string, error) {
	return familyRules(Rules{Devices: devices}, IPv4)
}

// familyRules are the rules of carve's chains in one family: those of
// desiredRules, and for a routed data path, in each chain after them, one
// rule per prefix of the family in r.Routed: a packet in on r.Underlay to
// the prefix goes on to OutChain, a packet out on r.Underlay to the prefix
// is accepted. -save prints the destination before the device.
func familyRules(r Rules, fam Family) ([]string, error) {
	devs := slices.Clone(r.Devices)
	slices.Sort(devs)
	devs = slices.Compact(devs)
	if len(devs) > 0 && devs[0] == "" {
		devs = devs[1:]
	}
	for _, d := range devs {
		if err := checkDevice(d); err != nil {
			return nil, err
		}
	}
	var routed []string
	if r.Underlay != "" && len(devs) > 0 {
		if err := checkDevice(r.Underlay); err != nil {
			return nil, err
		}
		for _, p := range r.Routed {
			if p.IsValid() && p.Addr().Is4() == (fam == IPv4) {
				routed = append(routed, p.Masked().String())
			}
		}
		slices.Sort(routed)
		routed = slices.Compact(routed)
	}
	var rules []string
	for _, d := range devs {
		rules = append(rules, "-A "+Chain+" -i "+d+" -j "+OutChain)
	}
	for _, p := range routed {
		rules = append(rules, "-A "+Chain+" -d "+p+" -i "+r.Underlay+" -j "+OutChain)
	}
	for _, d := range devs {
		rules = append(rules, "-A "+OutChain+" -o "+d+" -j ACCEPT")
	}
	for _, p := range routed {
		rules = append(rules, "-A "+OutChain+" -d "+p+" -o "+r.Underlay+" -j ACCEPT")
	}
	return rules, nil
}

// devicesOf are the devices of rules, for the log.
func devicesOf(rules []string) string {
	var devs []string
	for _, r := range rules {
		if f := strings.Fields(r); len(f) >= 4 && f[1] == Chain && f[2] == "-i" {
			devs = append(devs, f[3])
		}
	}
	return strings.Join(devs, ",")
}

// checkDevice refuses a name that is no Linux interface name or that
// iptables would read as more than one interface ('+' is its wildcard,
// '!' its negation).
func checkDevice(d string) error {
	if len(d) > 15 || strings.HasPrefix(d, "-") || strings.ContainsAny(d, "+!/ \t\n\r:\"'") || d == "." || d == ".." {
		return fmt.Errorf("firewall: %w %q: want a Linux interface name (at most 15 characters; no '+', '!', '/', ':', quote or space)", ErrBadDevice, d)
	}
	return nil
}

// ensureScript replaces carve's chains with want and puts the jump first
// in FORWARD, in one transaction: declaring a chain under --noflush
// creates or empties it.
func ensureScript(st filterState, want []string) string {
	var b strings.Builder
	b.WriteString("*filter\n:" + Chain + " - [0:0]\n:" + OutChain + " - [0:0]\n")
	for _, r := range want {
		b.WriteString(r + "\n")
	}
	for range st.jumps {
		b.WriteString("-D FORWARD -j " + Chain + "\n")
	}
	b.WriteString("-I FORWARD 1 -j " + Chain + "\nCOMMIT\n")
	return b.String()
}

// removeScript takes out the jumps and carve's chains.
func removeScript(st filterState) string {
	var b strings.Builder
	b.WriteString("*filter\n")
	for range st.jumps {
		b.WriteString("-D FORWARD -j " + Chain + "\n")
	}
	b.WriteString(":" + Chain + " - [0:0]\n:" + OutChain + " - [0:0]\n-X " + Chain + "\n-X " + OutChain + "\nCOMMIT\n")
	return b.String()
}
