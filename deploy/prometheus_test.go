package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

// alertRules and alertTests are the alert rules and their promtool unit
// tests.
const (
	alertRules = "prometheus/carve-alerts.yml"
	alertTests = "prometheus/carve-alerts.test.yml"
)

// TestAlertRules checks the alert rules with promtool and runs their unit
// tests (each alert fires on its trouble, not on a healthy neighbour).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	testutil.Require(t, err == nil, "promtool is not installed (Debian package prometheus: deploy/install-deps.sh): the alert rules are not checked")
	for _, args := range [][]string{{"check", "rules", filepath.Base(alertRules)}, {"test", "rules", filepath.Base(alertTests)}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Dir(alertRules)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var (
	carveMetric  = regexp.MustCompile(`\bcarve_[a-z0-9_]+\b`)
	exprLine     = regexp.MustCompile(`(?m)^\s+expr: (.*)$`)
	troubleLink  = regexp.MustCompile(`docs/troubleshooting\.md#([a-z0-9-]+)`)
	quotedMetric = regexp.MustCompile(`"(carve_[a-z0-9_]+)"`)
)

// TestAlertRulesReadRealMetrics: every metric an alert reads is one the
// code exports (a renamed metric would silence its alert), and every
// alert points at a section of docs/troubleshooting.md that exists.
func TestAlertRulesReadRealMetrics(t *testing.T) {
	rules, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == "third_party" || strings.HasPrefix(d.Name(), ".")) && path != repoRoot:
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range quotedMetric.FindAllStringSubmatch(string(src), -1) {
			exported[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	for _, e := range exprLine.FindAllStringSubmatch(string(rules), -1) {
		read = append(read, carveMetric.FindAllString(e[1], -1)...)
	}
	if len(read) == 0 {
		t.Fatal("the rules read no carve_ metric")
	}
	for _, m := range read {
		if !exported[m] {
			t.Errorf("%s reads %s, which no carve package exports", alertRules, m)
		}
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs/troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := anchors(string(doc))
	for _, m := range troubleLink.FindAllStringSubmatch(string(rules), -1) {
		if !sections[m[1]] {
			t.Errorf("%s points at docs/troubleshooting.md#%s, which has no such section", alertRules, m[1])
		}
	}
}
