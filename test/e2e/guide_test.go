package e2e

// The troubleshooting guide as troubleshooting_test.go reads and runs it:
// its sections cut at their bold markers, the commands of their code
// blocks and prose, and an operator's shell in a lab host's namespace.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// guidePath is the troubleshooting guide, from this package's directory.
const guidePath = "../../docs/troubleshooting.md"

// guideSection is one "## " section of the guide, cut at its bold
// markers: **Symptom.**, **Commands...** and **Fix...**.
type guideSection struct {
	Title, Symptom, Commands, Fixes string
}

// guide is the troubleshooting guide as the tests read it.
type guide struct {
	op       string // OP='...' as the guide sets it
	sections map[string]guideSection
}

var opLine = regexp.MustCompile(`(?m)^OP='([^']*)'$`)

// readGuide reads and cuts the guide.
func readGuide(t *testing.T) guide {
	t.Helper()
	data, err := os.ReadFile(guidePath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	m := opLine.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("%s sets no OP='...'", guidePath)
	}
	g := guide{op: m[1], sections: map[string]guideSection{}}
	for _, part := range strings.Split(text, "\n## ")[1:] {
		title, body, _ := strings.Cut(part, "\n")
		var s guideSection
		s.Title = title
		cut := func(body, marker string) (string, string) {
			i := strings.Index(body, marker)
			if i < 0 {
				return body, ""
			}
			return body[:i], body[i:]
		}
		rest := body
		s.Symptom, rest = cut(rest, "**Commands")
		s.Commands, s.Fixes = cut(rest, "**Fix")
		g.sections[title] = s
	}
	return g
}

// section is the section titled title; the test fails when the guide has
// none.
func (g guide) section(t *testing.T, title string) guideSection {
	t.Helper()
	s, ok := g.sections[title]
	if !ok {
		t.Fatalf("%s has no section %q", guidePath, title)
	}
	return s
}

// codeLines are the command lines of the fenced code blocks of text.
func codeLines(text string) []string {
	var out []string
	in := false
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "```") {
			in = !in
			continue
		}
		if in && l != "" {
			out = append(out, l)
		}
	}
	return out
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// inlineCommands are the code spans of text that start with prefix (the
// commands a Fixes paragraph names in its prose).
func inlineCommands(text, prefix string) []string {
	var out []string
	for _, m := range inlineCode.FindAllStringSubmatch(strings.ReplaceAll(text, "\n", " "), -1) {
		if strings.HasPrefix(m[1], prefix) {
			out = append(out, m[1])
		}
	}
	return out
}

// requireCommand fails the test when lines hold no line starting with
// prefix: a check of the guide's content, so that a recipe losing its
// command fails here rather than testing nothing.
func requireCommand(t *testing.T, lines []string, prefix string) {
	t.Helper()
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return
		}
	}
	t.Fatalf("the guide's recipe has no command %q; its commands: %q", prefix, lines)
}

// operator runs the guide's commands in the lab as an operator would.
type operator struct {
	c   *labcluster.Cluster
	dir string // the working directory: ca.pem, alice.pem, alice-key.pem
	bin string // carve, on PATH
	op  string
}

// newOperator prepares the working directory and OP (the guide's, with the
// lab's masters).
func newOperator(t *testing.T, c *labcluster.Cluster, g guide) *operator {
	t.Helper()
	o := &operator{c: c, dir: t.TempDir(), bin: t.TempDir()}
	files := c.OperatorFiles()
	for name, target := range map[string]string{"ca.pem": files.CA, "alice.pem": files.Cert, "alice-key.pem": files.Key,
		filepath.Join(o.bin, "carve"): os.Getenv(labcluster.BinaryEnv)} {
		if !filepath.IsAbs(name) {
			name = filepath.Join(o.dir, name)
		}
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	masters := regexp.MustCompile(`--masters \S+`)
	if !masters.MatchString(g.op) {
		t.Fatalf("the guide's OP has no --masters: %q", g.op)
	}
	o.op = masters.ReplaceAllLiteralString(g.op, "--masters "+strings.Join(c.MasterURLs(), ","))
	return o
}

// journalShell stands in for journalctl: the log of the unit's process on
// this host, the last -n lines of it when given.
const journalShell = `journalctl() {
  unit= n=
  while [ $# -gt 0 ]; do
    case "$1" in -u) unit=$2; shift ;; -n) n=$2; shift ;; esac
    shift
  done
  case "$unit" in carve-agent) f=$CARVE_AGENT_LOG ;; carve-master) f=$CARVE_MASTER_LOG ;; *) echo "journalctl: no unit $unit in the lab" >&2; return 1 ;; esac
  if [ -n "$n" ]; then tail -n "$n" "$f"; else cat "$f"; fi
}
`

// skipReason says why the lab does not run line, or "".
func skipReason(line string) string {
	prog, _, _ := strings.Cut(line, " ")
	switch prog {
	case "systemctl":
		return "no systemd units in the lab"
	case "tcpdump":
		return "a capture by hand (it waits for traffic)"
	case "sh":
		if strings.Contains(line, "/etc/carve/") {
			return "the lab's processes run from flags, not env files"
		}
	case "curl", "carve", "ip", "bridge", "iptables", "journalctl", "sha256sum", "df":
	default:
		if _, err := exec.LookPath(prog); err != nil {
			return prog + " is not installed"
		}
	}
	return ""
}

// result is what a command printed and how it exited.
type result struct {
	line        string
	out, stderr string
	exited      int
}

// run runs one line of the guide in h's namespace, words of replace
// replaced first, and returns its result; ok false when it was skipped.
func (o *operator) run(ctx context.Context, t *testing.T, h *labcluster.Host, line string, replace map[string]string) (result, bool) {
	t.Helper()
	if why := skipReason(line); why != "" {
		t.Logf("skipped %q: %s", line, why)
		return result{}, false
	}
	cmdLine := line
	for from, to := range replace {
		cmdLine = strings.ReplaceAll(cmdLine, from, to)
	}
	script := "OP='" + o.op + "'\n" + journalShell + cmdLine + "\n"
	argv := h.NS.ExecArgs("sh", "-c", script)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = o.dir
	cmd.Env = append(os.Environ(), "PATH="+o.bin+":"+os.Getenv("PATH"), "CARVE_AGENT_LOG="+h.Agent.LogPath)
	if h.Master != nil {
		cmd.Env = append(cmd.Env, "CARVE_MASTER_LOG="+h.Master.LogPath)
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{line: line, out: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.exited = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s on %s: %v", cmdLine, h.Name, err)
	}
	t.Logf("%s$ %s\n(exit %d)\n%s%s", h.Name, cmdLine, r.exited, r.out, r.stderr)
	return r, true
}

// runAll runs every line (skipped ones left out) and returns the results
// by line.
func (o *operator) runAll(ctx context.Context, t *testing.T, h *labcluster.Host, lines []string, replace map[string]string) map[string]result {
	t.Helper()
	out := map[string]result{}
	for _, l := range lines {
		if r, ok := o.run(ctx, t, h, l, replace); ok {
			out[l] = r
		}
	}
	return out
}

// startingWith is the result of the one line starting with prefix.
func startingWith(t *testing.T, results map[string]result, prefix string) result {
	t.Helper()
	for l, r := range results {
		if strings.HasPrefix(l, prefix) {
			return r
		}
	}
	t.Fatalf("no command %q ran", prefix)
	return result{}
}

// startingWithLine is the one line of lines starting with prefix.
func startingWithLine(t *testing.T, lines []string, prefix string) string {
	t.Helper()
	requireCommand(t, lines, prefix)
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// waitPings waits until every container pings every other.
func waitPings(ctx context.Context, t *testing.T, cs []*labcluster.Container) {
	t.Helper()
	testutil.Eventually(t, converge, "every container pings every other", func() error {
		m := labcluster.Ping(ctx, cs)
		if err := m.Err(); err != nil {
			return fmt.Errorf("%v\n%s", err, m)
		}
		return nil
	})
}

// problemExamples are the problem lines a section's prose quotes (code
// spans outside its code blocks that name a master or say no leader).
func problemExamples(text string) []string {
	var prose []string
	in := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if !in {
			prose = append(prose, l)
		}
	}
	var out []string
	for _, span := range inlineCommands(strings.Join(prose, "\n"), "") {
		if strings.HasPrefix(span, "master ") || span == "no leader" {
			out = append(out, span)
		}
	}
	return out
}

// matchesProblem tells whether the report has a problem line that starts
// as the guide's example ex describes: "..." stands for anything, and the
// example's master ids and addresses for any.
func matchesProblem(report, ex string) bool {
	pattern := regexp.QuoteMeta(ex)
	pattern = strings.ReplaceAll(pattern, `\.\.\.`, ".*")
	pattern = regexp.MustCompile(`198\\\.18\\\.0\\\.[0-9]+`).ReplaceAllLiteralString(pattern, `198\.18\.[0-9]+\.[0-9]+`)
	pattern = regexp.MustCompile(`\bm[0-9]+\b`).ReplaceAllLiteralString(pattern, `m[0-9]+`)
	re := regexp.MustCompile("^problem: " + pattern)
	for _, l := range strings.Split(report, "\n") {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// voterSetOf renders the voters of a Raft configuration in order.
func voterSetOf(servers []api.ServerInfo) string {
	var ids []string
	for _, s := range servers {
		if s.Voter {
			ids = append(ids, s.ID)
		}
	}
	return strings.Join(ids, ",")
}
