package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestVersionFromGit: the version make build stamps into carve
// (deploy/version.sh through the Makefile's -ldflags) in the checkouts a
// build meets: the tagged release commit, commits after it, a modified
// tree, a history with no release tag, a clone of the tag, a shallow
// clone without tags (as CI's checkouts fetch), and no git at all.
func TestVersionFromGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	script, err := filepath.Abs("version.sh")
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	src := filepath.Join(root, "src")
	gitIn(t, root, "init", "-q", "-b", "main", src)
	commit := func(content string) {
		t.Helper()
		writeFile(t, filepath.Join(src, "file"), content)
		gitIn(t, src, "add", "-A")
		gitIn(t, src, "commit", "-q", "-m", "commit "+content)
	}
	// The repository holds the Makefile and the script, so that make's
	// own expansion is checked too.
	writeFile(t, filepath.Join(src, "Makefile"), string(makefile))
	copyExecutable(t, script, filepath.Join(src, "deploy", "version.sh"))
	commit("1")
	if got, _ := runVersion(t, src, script); !regexp.MustCompile(`^dev-[0-9a-f]{7,}$`).MatchString(got) {
		t.Errorf("no tag yet: %q, want dev-SHA", got)
	}
	gitIn(t, src, "tag", "-a", "v0.4.0", "-m", "carve v0.4.0")
	gitIn(t, src, "tag", "nightly") // not a release tag: ignored
	if got, _ := runVersion(t, src, script); got != "v0.4.0" {
		t.Errorf("on the tag: %q, want v0.4.0", got)
	}
	commit("2")
	commit("3")
	head := strings.TrimSpace(gitIn(t, src, "rev-parse", "--short", "HEAD"))
	if got, _ := runVersion(t, src, script); got != "v0.4.0-2-g"+head {
		t.Errorf("two commits after the tag: %q, want v0.4.0-2-g%s", got, head)
	}
	writeFile(t, filepath.Join(src, "file"), "modified")
	if got, _ := runVersion(t, src, script); got != "v0.4.0-2-g"+head+"-dirty" {
		t.Errorf("a modified tree: %q, want v0.4.0-2-g%s-dirty", got, head)
	}
	gitIn(t, src, "checkout", "-q", "--", "file")
	gitIn(t, src, "tag", "-a", "v0.5.0", "-m", "carve v0.5.0")

	clone := func(name string, args ...string) string {
		t.Helper()
		dir := filepath.Join(root, name)
		gitIn(t, root, append(append([]string{"clone", "-q"}, args...), "file://"+src, dir)...)
		return dir
	}
	tests := []struct {
		name       string
		dir        string
		want       string
		wantStderr string
	}{
		{"a fresh clone", clone("full"), "v0.5.0", ""},
		{"a shallow clone of the tagged commit", clone("shallow", "--depth", "1"), "v0.5.0", ""},
		{"a shallow clone without tags", clone("notags", "--depth", "1", "--no-tags"), "dev-" + head, "git fetch --unshallow --tags"},
		{"no git checkout", t.TempDir(), "dev", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, stderr := runVersion(t, tt.dir, script)
			if got != tt.want || !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("version %q (stderr %q), want %q (stderr naming %q)", got, stderr, tt.want, tt.wantStderr)
			}
		})
	}

	// make build stamps it: the Makefile's -ldflags carry the version.
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	cmd := exec.Command("make", "-n", "build")
	cmd.Dir = clone("make")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	if want := "buildinfo.version=v0.5.0 "; !strings.Contains(string(out), want) {
		t.Errorf("make -n build does not stamp %q:\n%s", want, out)
	}
}

// runVersion runs version.sh in dir: its output and its stderr.
func runVersion(t *testing.T, dir, script string) (version, stderr string) {
	t.Helper()
	cmd := exec.Command(script)
	cmd.Dir = dir
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("version.sh in %s: %v\n%s", dir, err, errb.String())
	}
	return strings.TrimSpace(string(out)), errb.String()
}

// gitIn runs git in dir with a fixed identity and no user configuration.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(b))
	if err := os.Chmod(to, 0o755); err != nil {
		t.Fatal(err)
	}
}
