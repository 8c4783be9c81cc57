package deploy

import (
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-net/carve/test/lab/labcluster"
)

// The documentation's one rule about flags: docs/configuration.md lists,
// under a heading that names a command, exactly the flags that command has,
// and every --flag the README and docs/ name for a command exists. A
// command's flags are those its own flag set prints for -h (PrintDefaults of
// the real flag.FlagSet); the commands are those `carve help` lists, plus
// carve-lab's hidden rogue-gossip. carve-ipam has no flag set: a CNI runtime
// configures it through its environment and stdin.

// repoRoot is the repository, seen from this package's directory.
const repoRoot = ".."

// configurationDoc is the page that documents every flag.
const configurationDoc = "docs/configuration.md"

// hiddenCommands are commands `carve help` does not list.
var hiddenCommands = []string{"carve-lab rogue-gossip"}

// otherPrograms' flags are named in the docs beside carve's: Docker's
// (`docker run --net`, `--ip`, `--ip-range` of a network), Podman's (`--network`),
// the Mesos agent's.
var otherPrograms = []string{"net", "network", "ip", "ip-range", "subnet", "network_cni_config_dir"}

// buildBinaries puts the given commands (cmd/NAME) into one temporary
// directory, as make build puts them in bin/: carve demo runs the carve-lab
// beside carve. Where make test built them already ($CARVE_BINARY,
// $CARVE_LAB_BINARY, as the lab tests take them) the directory links those:
// a build here would link carve again for every test that asks.
func buildBinaries(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range names {
		pkg, env := "github.com/carve-net/carve/cmd/"+name, ""
		switch name {
		case "carve":
			env = labcluster.BinaryEnv
		case "carve-lab": // the lab's binary lives with what does not ship
			pkg, env = "github.com/carve-net/carve/test/cmd/"+name, labcluster.LabBinaryEnv
		}
		if built := os.Getenv(env); env != "" && built != "" {
			if err := os.Symlink(built, filepath.Join(dir, name)); err != nil {
				t.Fatalf("link %s from $%s: %v", name, env, err)
			}
			continue
		}
		// go test puts the go command of its toolchain first on the test's PATH.
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
	}
	return dir
}

var printedFlag = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_-]*)`)

// commandFlags runs `dir/PROGRAM ARGS... -h` for command ("carve ipam
// show", "carve-lab rogue-gossip") and returns its flags, each with the
// block its flag set printed for it (its type, usage and default).
func commandFlags(t *testing.T, dir, command string) map[string]string {
	t.Helper()
	words := strings.Fields(command)
	out, err := exec.Command(filepath.Join(dir, words[0]), append(words[1:], "-h")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s -h: %v\n%s", command, err, out)
	}
	flags := map[string]string{}
	var current string
	for _, line := range strings.Split(string(out), "\n") {
		if m := printedFlag.FindStringSubmatch(line); m != nil {
			current = m[1]
			flags[current] = line
		} else if current != "" && strings.HasPrefix(line, "    ") {
			flags[current] += "\n" + line
		} else {
			current = ""
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s -h printed no flags:\n%s", command, out)
	}
	return flags
}

var usageCommand = regexp.MustCompile(`(?m)^  (carve(?: +[a-z][a-z-]*){1,2})`)

// carveCommands returns the usage text of `carve help` and every command it
// lists ("carve master", "carve ipam show"), then the hidden ones.
func carveCommands(t *testing.T, dir string) (string, []string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(dir, "carve"), "help").CombinedOutput()
	if err != nil {
		t.Fatalf("carve help: %v\n%s", err, out)
	}
	var commands []string
	for _, m := range usageCommand.FindAllStringSubmatch(string(out), -1) {
		if c := strings.Join(strings.Fields(m[1]), " "); !slices.Contains(commands, c) {
			commands = append(commands, c)
		}
	}
	if len(commands) < 5 {
		t.Fatalf("carve help lists only %q:\n%s", commands, out)
	}
	return string(out), append(commands, hiddenCommands...)
}

// docRow is one row of a flag table: the flags of its first column and its
// cells.
type docRow struct {
	flags []string
	cells []string
}

var (
	heading    = regexp.MustCompile(`^#{1,6} (.*)$`)
	codeSpan   = regexp.MustCompile("`([^`]*)`")
	flagRow    = regexp.MustCompile("^\\| ((?:`--[a-z0-9-]+`(?:, )?)+) \\|")
	flagInCell = regexp.MustCompile("`--([a-z0-9-]+)`")
)

// documentedFlags reads the flag tables of docs/configuration.md: for each
// command, the rows of the tables under every heading that names it (in a
// code span: "## `carve ipam show`"). A flag table under a heading that
// names no command, and a heading that names an unknown carve command, are
// problems.
func documentedFlags(text string, commands []string) (map[string][]docRow, []string) {
	documented := map[string][]docRow{}
	var problems, named []string
	var headingText string
	inCode := false
	for n, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if inCode {
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			headingText, named = m[1], nil
			for _, span := range codeSpan.FindAllStringSubmatch(m[1], -1) {
				c := strings.Join(strings.Fields(span[1]), " ")
				if !strings.HasPrefix(c, "carve") {
					continue
				}
				if !slices.Contains(commands, c) && c != "carve-ipam" {
					problems = append(problems, configurationDoc+": heading "+m[1]+" names `"+c+"`, which is no command")
					continue
				}
				named = append(named, c)
			}
			continue
		}
		m := flagRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if len(named) == 0 {
			problems = append(problems, configurationDoc+":"+strconv.Itoa(n+1)+": a flag table under "+headingText+", which names no command")
			continue
		}
		row := docRow{cells: splitRow(line)}
		for _, f := range flagInCell.FindAllStringSubmatch(m[1], -1) {
			row.flags = append(row.flags, f[1])
		}
		for _, c := range named {
			documented[c] = append(documented[c], row)
		}
	}
	return documented, problems
}

// splitRow returns a table row's cells, trimmed.
func splitRow(line string) []string {
	cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), " | ")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// rowFor returns the row documenting flag for command.
func rowFor(documented map[string][]docRow, command, flag string) (docRow, bool) {
	for _, r := range documented[command] {
		if slices.Contains(r.flags, flag) {
			return r, true
		}
	}
	return docRow{}, false
}

// flagProblems compares the documented flags with the commands' real ones:
// every flag of a command must be in its tables, and every flag in its
// tables must exist.
func flagProblems(documented map[string][]docRow, real map[string]map[string]string) []string {
	var problems []string
	for _, c := range slices.Sorted(maps.Keys(real)) {
		if len(documented[c]) == 0 {
			problems = append(problems, configurationDoc+" has no flag table under a heading that names `"+c+"`")
			continue
		}
		for _, f := range slices.Sorted(maps.Keys(real[c])) {
			if _, ok := rowFor(documented, c, f); !ok {
				problems = append(problems, configurationDoc+" does not document --"+f+" of "+c)
			}
		}
		for _, r := range documented[c] {
			for _, f := range r.flags {
				if _, ok := real[c][f]; !ok {
					problems = append(problems, configurationDoc+" documents --"+f+" for "+c+", which has no such flag")
				}
			}
		}
	}
	return problems
}

var namedFlag = regexp.MustCompile(`(?:^|[^A-Za-z0-9-])--([a-z0-9][a-z0-9_-]*)`)

// invocationProblems checks the --flags text names: on a command line (a line
// of a code block, or a code span, that starts with a carve command; a code
// line ending in \ goes on) each must be a flag of that command; anywhere
// else each must be a flag of some command, or of another program the docs
// mention. Code lines and spans that start with another program are its own.
func invocationProblems(name, text string, real map[string]map[string]string) []string {
	var problems []string
	anyFlag := map[string]bool{}
	for _, flags := range real {
		for f := range flags {
			anyFlag[f] = true
		}
	}
	checkProse := func(where, s string) {
		for _, m := range namedFlag.FindAllStringSubmatch(s, -1) {
			if !anyFlag[m[1]] && !slices.Contains(otherPrograms, m[1]) {
				problems = append(problems, where+": --"+m[1]+" is a flag of no command")
			}
		}
	}
	checkInvocation := func(where, s string) bool {
		command := invokedCommand(s, real)
		words := strings.Fields(s)
		if command == "" {
			if len(words) > 0 && (words[0] == "carve" || words[0] == "carve-lab") && namedFlag.MatchString(s) {
				problems = append(problems, where+": "+strings.Join(words[:min(3, len(words))], " ")+" is no command, yet it is given flags")
			}
			// Another program's command line (`systemctl enable --now`,
			// `docker network create --driver=bridge`) names its own flags.
			return len(words) > 0 && !strings.HasPrefix(words[0], "-")
		}
		for _, m := range namedFlag.FindAllStringSubmatch(strings.SplitN(s, " # ", 2)[0], -1) {
			if _, ok := real[command][m[1]]; !ok {
				problems = append(problems, where+": "+command+" has no flag --"+m[1])
			}
		}
		return true
	}
	lines := strings.Split(text, "\n")
	var paragraph []string
	flush := func(n int) {
		p := strings.Join(paragraph, "\n")
		paragraph = nil
		where := name + ":" + strconv.Itoa(n)
		rest := codeSpan.ReplaceAllStringFunc(p, func(span string) string {
			if checkInvocation(where, strings.Trim(span, "`")) {
				return ""
			}
			return span
		})
		checkProse(where, rest)
	}
	inCode := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			flush(i)
			inCode = !inCode
			continue
		}
		if !inCode {
			if strings.TrimSpace(line) == "" {
				flush(i)
			} else {
				paragraph = append(paragraph, line)
			}
			continue
		}
		start := i + 1
		for strings.HasSuffix(strings.TrimSpace(lines[i]), `\`) && i+1 < len(lines) {
			i++
			line += "\n" + lines[i]
		}
		checkInvocation(name+":"+strconv.Itoa(start), strings.TrimPrefix(strings.TrimSpace(line), "$ "))
	}
	flush(len(lines))
	return problems
}

// invokedCommand is the longest command s starts with ("carve ipam show
// --json" is carve ipam show), or "" when s starts with none.
func invokedCommand(s string, real map[string]map[string]string) string {
	words := strings.Fields(s)
	for n := min(3, len(words)); n > 0; n-- {
		if c := strings.Join(words[:n], " "); real[c] != nil {
			return c
		}
	}
	return ""
}

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]*)\)`)
	notSlug = regexp.MustCompile(`[^a-z0-9 _-]`)
)

// anchors are the heading anchors of a markdown file, as GitHub makes them.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		m := heading.FindStringSubmatch(line)
		if inCode || m == nil {
			continue
		}
		slug := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		for n, s := 1, slug; ; n++ {
			if !out[s] {
				out[s] = true
				break
			}
			s = slug + "-" + strconv.Itoa(n)
		}
	}
	return out
}

// linkProblems checks the links of the markdown file at path (relative to
// the repository): each goes to a file of the repository (read with read),
// and to a heading of it when it names one; nothing sends the reader outside.
func linkProblems(path, text string, read func(string) ([]byte, error)) []string {
	var problems []string
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		target, anchor, _ := strings.Cut(m[1], "#")
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			problems = append(problems, path+": links outside the repository: "+m[1])
			continue
		}
		file := path
		if target != "" {
			file = filepath.Join(filepath.Dir(path), target)
		}
		if file == ".." || strings.HasPrefix(file, "../") || filepath.IsAbs(target) {
			problems = append(problems, path+": links outside the repository: "+m[1])
			continue
		}
		data, err := read(filepath.ToSlash(file))
		if err != nil {
			problems = append(problems, path+": broken link "+m[1]+": "+err.Error())
			continue
		}
		if anchor != "" && !anchors(string(data))[anchor] {
			problems = append(problems, path+": link "+m[1]+": "+file+" has no heading #"+anchor)
		}
	}
	return problems
}

// docFiles are the README and every page of docs/, relative to the repository.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, p := range append(pages, filepath.Join(repoRoot, "README.md")) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.ToSlash(rel)] = string(data)
	}
	if _, ok := files[configurationDoc]; !ok {
		t.Fatalf("no %s", configurationDoc)
	}
	return files
}

// realFlags returns every command's flags, built from dir.
func realFlags(t *testing.T, dir string, commands []string) map[string]map[string]string {
	t.Helper()
	real := map[string]map[string]string{}
	for _, c := range commands {
		real[c] = commandFlags(t, dir, c)
	}
	return real
}

// docProblems is every problem the rule finds in files against the real
// flags and the usage text of `carve help`.
func docProblems(files map[string]string, usage string, real map[string]map[string]string) []string {
	documented, problems := documentedFlags(files[configurationDoc], slices.Collect(maps.Keys(real)))
	problems = append(problems, flagProblems(documented, real)...)
	problems = append(problems, invocationProblems("carve help", "```\n"+usage+"```\n", real)...)
	// A link goes to a page being checked, or else to a file of the repository.
	read := func(file string) ([]byte, error) {
		if text, ok := files[file]; ok {
			return []byte(text), nil
		}
		data, err := os.ReadFile(filepath.Join(repoRoot, file))
		if errors.Is(err, os.ErrNotExist) {
			return nil, errors.New("no such file")
		}
		return data, err
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		problems = append(problems, invocationProblems(name, files[name], real)...)
		problems = append(problems, linkProblems(name, files[name], read)...)
	}
	return problems
}

// TestDocsNameEveryFlag: docs/configuration.md documents every flag of every
// command, in that command's section, and no flag a command lacks; the
// README, docs/ and `carve help` name only flags that exist, each for a
// command that has it; every link between the pages resolves, and none
// leaves the repository.
func TestDocsNameEveryFlag(t *testing.T) {
	dir := buildBinaries(t, "carve", "carve-lab")
	usage, commands := carveCommands(t, dir)
	real := realFlags(t, dir, commands)
	files := docFiles(t)
	if problems := docProblems(files, usage, real); len(problems) > 0 {
		t.Fatalf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	}
	t.Logf("%d commands: %s", len(commands), strings.Join(commands, ", "))
}

// TestDocsRuleCatchesMistakes: the rule above fails on an undocumented flag,
// a documented flag that does not exist, a flag given to the wrong command,
// a flag of no command, a heading naming no command, and links that are
// broken or leave the repository.
func TestDocsRuleCatchesMistakes(t *testing.T) {
	real := map[string]map[string]string{
		"carve agent":     {"data-dir": "", "masters": ""},
		"carve ipam show": {"json": "", "agent": ""},
	}
	good := "# Configuration\n\n## `carve agent`\n\n| flag | meaning |\n| --- | --- |\n| `--data-dir`, `--masters` | x |\n\n" +
		"## `carve ipam show`\n\n| `--json` | x |\n| `--agent` | x |\n\n```\ncarve agent --data-dir D \\\n  --masters M\n```\n\n" +
		"Run `carve ipam show --json`; see [below](#carve-agent) and `--net` of docker.\n"
	if p := docProblems(map[string]string{configurationDoc: good}, "", real); len(p) > 0 {
		t.Fatalf("the good page has problems:\n%s", strings.Join(p, "\n"))
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"undocumented flag", "| `--agent` | x |\n", "", "does not document --agent of carve ipam show"},
		{"flag that does not exist", "| `--json` |", "| `--json`, `--yaml` |", "documents --yaml for carve ipam show, which has no such flag"},
		{"flag of another command on a code line", "  --masters M", "  --masters M --json", "carve agent has no flag --json"},
		{"flag of another command in a code span", "`carve ipam show --json`", "`carve ipam show --data-dir x`", "carve ipam show has no flag --data-dir"},
		{"flag of no command", "`--net` of docker", "`--nett` of docker", "--nett is a flag of no command"},
		{"unknown command", "`carve ipam show --json`", "`carve ipam list --json`", "carve ipam list is no command"},
		{"heading naming no command", "## `carve ipam show`", "## `carve ipam list`", "names `carve ipam list`, which is no command"},
		{"command without a table", "## `carve ipam show`", "## ipam", "no flag table under a heading that names `carve ipam show`"},
		{"broken anchor", "(#carve-agent)", "(#carve-agents)", "has no heading #carve-agents"},
		{"broken file", "(#carve-agent)", "(nothing.md)", "broken link nothing.md"},
		{"link outside", "(#carve-agent)", "(../../shared/x.md)", "links outside the repository"},
		{"external link", "(#carve-agent)", "(https://example.com/)", "links outside the repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("the good page has no %q: update the test", tc.old)
			}
			bad := strings.Replace(good, tc.old, tc.new, 1)
			p := docProblems(map[string]string{configurationDoc: bad}, "", real)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Fatalf("want a problem with %q, got %q", tc.want, p)
			}
		})
	}
}
