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
// package of the module (a row of its own, or a test/bench/*/ style row above
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

// TestNoBuildOutputCommitted fails when git tracks an executable binary (an
// ELF file) or a file over 2 MB: build outputs belong in bin/, which is
// ignored, and a committed binary is stale the moment the code changes.
func TestNoBuildOutputCommitted(t *testing.T) {
	out, err := exec.Command("git", "-C", repoRoot, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		path := filepath.Join(repoRoot, name)
		st, err := os.Lstat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if st.Size() > 2_000_000 {
			t.Errorf("%s is committed and has %d bytes: a build output or data that does not belong in the repository", name, st.Size())
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		magic := make([]byte, 4)
		n, _ := f.Read(magic)
		f.Close()
		if n == 4 && string(magic) == "\x7fELF" {
			t.Errorf("%s is an executable binary committed to the repository: remove it (git rm --cached) and build it with make build", name)
		}
	}
}
