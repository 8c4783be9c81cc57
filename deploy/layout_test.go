package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// designDoc holds the layout table.
const designDoc = "docs/design.md"

// layoutRow is a row of the layout tables: a path in backquotes, then its job.
var layoutRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\| (.+) \\|$")

// TestLayoutTableNamesEveryPackage: docs/design.md's layout names every
// package of the module (a row of its own, or a bench/*/ style row above
// it), with a job; and every path it names exists.
func TestLayoutTableNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, designDoc))
	if err != nil {
		t.Fatal(err)
	}
	section := string(doc)
	if i := strings.Index(section, "## Layout"); i >= 0 {
		section = section[i:]
		if j := strings.Index(section[len("## Layout"):], "\n## "); j >= 0 {
			section = section[:len("## Layout")+j]
		}
	}
	rows := map[string]string{}
	var globs []string
	for _, m := range layoutRow.FindAllStringSubmatch(section, -1) {
		path, job := strings.TrimSuffix(m[1], "/"), strings.TrimSpace(m[2])
		rows[path] = job
		if strings.Contains(path, "*") {
			globs = append(globs, path)
			continue
		}
		if st, err := os.Stat(filepath.Join(repoRoot, path)); err != nil || !st.IsDir() {
			t.Errorf("%s names %s/, which is not a directory of the repository", designDoc, path)
		}
		if len(job) < 10 {
			t.Errorf("%s: the row of %s/ says no job (%q)", designDoc, path, job)
		}
	}
	if len(rows) < 20 {
		t.Fatalf("%s: found only %d layout rows; is the table still under ## Layout?", designDoc, len(rows))
	}
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/carve-net/carve/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		if _, ok := rows[rel]; ok {
			continue
		}
		covered := false
		for _, g := range globs {
			if ok, _ := filepath.Match(g, rel); ok {
				covered = true
			}
		}
		if !covered {
			t.Errorf("package %s/ has no row in %s's layout: add one that says its job", rel, designDoc)
		}
	}
}
