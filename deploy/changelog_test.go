package deploy

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// releasedVariables records the CARVE_* variables of the env examples and
// the units as of the newest release in CHANGELOG.md.
const releasedVariables = "testdata/released-variables.txt"

// carveVariable is a CARVE_* name in a unit's or an env file's text.
var carveVariable = regexp.MustCompile(`\bCARVE_[A-Z0-9_]+\b`)

// TestChangelogNamesVariableChanges (issue 27): a variable added to or
// removed from an env example, or set by a unit, since the newest release
// is named in CHANGELOG.md's Unreleased section (an operator's env file
// changes with it); and at a release, releasedVariables is brought up to
// that release. docs/configuration.md naming every variable is
// TestUnitsMatchBinaryAndEnv's.
func TestChangelogNamesVariableChanges(t *testing.T) {
	changelog, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	release, released := readReleasedVariables(t)
	current := currentVariables(t)
	for _, p := range variableChangeProblems(string(changelog), release, released, current) {
		t.Error(p)
	}
}

// TestVariableChangeRuleCatchesMistakes: the rule above fails on a
// variable added or removed without a changelog line, and on a release
// the recorded variables do not follow.
func TestVariableChangeRuleCatchesMistakes(t *testing.T) {
	const changelog = "# Changelog\n\n## [Unreleased]\n\n- `CARVE_NEW` in agent.env: ...\n\n## [v0.4.0] - 2026-11-29\n\n- `CARVE_OLD` ...\n"
	released := []string{"agent.env CARVE_A", "agent.env CARVE_OLD"}
	tests := []struct {
		name      string
		changelog string
		release   string
		current   []string
		want      []string // a part of each problem
	}{
		{"unchanged", changelog, "v0.4.0", released, nil},
		{"renamed, only the new name named", "## [Unreleased]\n\n- `CARVE_A_B` replaces ...\n\n## [v0.4.0]\n", "v0.4.0", []string{"agent.env CARVE_A_B", "agent.env CARVE_OLD"},
			[]string{"CARVE_A was removed from agent.env"}},
		{"added and named", changelog, "v0.4.0", []string{"agent.env CARVE_A", "agent.env CARVE_NEW", "agent.env CARVE_OLD"}, nil},
		{"added, not named", changelog, "v0.4.0", []string{"agent.env CARVE_A", "agent.env CARVE_B", "agent.env CARVE_OLD"},
			[]string{"CARVE_B was added to agent.env since v0.4.0"}},
		{"removed, named only in a release", changelog, "v0.4.0", []string{"agent.env CARVE_A"},
			[]string{"CARVE_OLD was removed from agent.env since v0.4.0"}},
		{"moved to another file", changelog, "v0.4.0", []string{"agent.env CARVE_OLD", "master.env CARVE_A"},
			[]string{"CARVE_A was removed from agent.env", "CARVE_A was added to master.env"}},
		{"a release the file does not follow", strings.Replace(changelog, "## [v0.4.0]", "## [v0.5.0] - 2026-12-01\n\n## [v0.4.0]", 1), "v0.4.0", released,
			[]string{"newest release in CHANGELOG.md is v0.5.0, " + releasedVariables + " records the variables of v0.4.0: once the release's section names every change, write it as\nrelease v0.5.0\nagent.env CARVE_A\nagent.env CARVE_OLD\n"}},
		{"no release", "# Changelog\n\n## [Unreleased]\n", "v0.4.0", released, []string{"no release section"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := variableChangeProblems(tt.changelog, tt.release, released, tt.current)
			if len(got) != len(tt.want) {
				t.Fatalf("problems %q, want %d naming %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d %q lacks %q", i, got[i], w)
				}
			}
		})
	}
}

// variableChangeProblems compares the variables ("FILE VARIABLE", sorted)
// recorded at release with the current ones against the changelog.
func variableChangeProblems(changelog, release string, released, current []string) []string {
	newest, unreleased := changelogSections(changelog)
	if newest == "" {
		return []string{"CHANGELOG.md has no release section (## [vX.Y.Z] - DATE)"}
	}
	if newest != release {
		return []string{fmt.Sprintf("the newest release in CHANGELOG.md is %s, %s records the variables of %s: once the release's section names every change, write it as\n%s",
			newest, releasedVariables, release, formatReleasedVariables(newest, current))}
	}
	var problems []string
	for _, e := range released {
		if !slices.Contains(current, e) {
			file, name, _ := strings.Cut(e, " ")
			if !names(unreleased, name) {
				problems = append(problems, fmt.Sprintf("%s was removed from %s since %s: CHANGELOG.md's Unreleased section does not name it (say what replaces it and whether a rollback can use the old env file)", name, file, release))
			}
		}
	}
	for _, e := range current {
		if !slices.Contains(released, e) {
			file, name, _ := strings.Cut(e, " ")
			if !names(unreleased, name) {
				problems = append(problems, fmt.Sprintf("%s was added to %s since %s: CHANGELOG.md's Unreleased section does not name it (say what it does, what an empty value means, and whether a rollback can keep it)", name, file, release))
			}
		}
	}
	return problems
}

// names tells whether text names the variable (CARVE_A is not named by
// CARVE_A_B).
func names(text, variable string) bool {
	return regexp.MustCompile(`\b` + regexp.QuoteMeta(variable) + `\b`).MatchString(text)
}

// changelogSections returns the newest release's version ("v0.4.0") and
// the text of the Unreleased section.
func changelogSections(changelog string) (newest, unreleased string) {
	heading := regexp.MustCompile(`(?m)^## \[([^\]]+)\]`)
	locs := heading.FindAllStringSubmatchIndex(changelog, -1)
	for i, loc := range locs {
		name := changelog[loc[2]:loc[3]]
		end := len(changelog)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		switch {
		case name == "Unreleased":
			unreleased = changelog[loc[1]:end]
		case newest == "":
			newest = name
		}
	}
	return newest, unreleased
}

// readReleasedVariables reads releasedVariables: "release vX.Y.Z", then
// one "FILE VARIABLE" a line.
func readReleasedVariables(t *testing.T) (release string, entries []string) {
	t.Helper()
	f, err := os.Open(releasedVariables)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "release "):
			release = strings.TrimPrefix(line, "release ")
		default:
			entries = append(entries, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if release == "" {
		t.Fatalf("%s names no release", releasedVariables)
	}
	slices.Sort(entries)
	return release, entries
}

// currentVariables are the variables each env example defines and each
// unit names outside its comments, "FILE VARIABLE", sorted.
func currentVariables(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, u := range units {
		for v := range readEnv(t, u.env) {
			out = append(out, filepath.Base(u.env)+" "+v)
		}
		for _, line := range strings.Split(readUnit(t, u.file), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, v := range carveVariable.FindAllString(line, -1) {
				if e := u.file + " " + v; !slices.Contains(out, e) {
					out = append(out, e)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// formatReleasedVariables is the content of releasedVariables for release.
func formatReleasedVariables(release string, entries []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "release %s\n", release)
	for _, e := range entries {
		b.WriteString(e + "\n")
	}
	return b.String()
}
