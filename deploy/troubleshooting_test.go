package deploy

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
)

// troubleshootingDoc is the operators' symptom -> command -> fix guide.
const troubleshootingDoc = "docs/troubleshooting.md"

var (
	labAddress = regexp.MustCompile(`198\.18\.0\.\d+:\d+`)
	opVariable = regexp.MustCompile(`(?m)^OP='([^']*)'$`)
)

// TestTroubleshootingCommandsAreReal runs every carve command of the
// guide's code blocks, $OP expanded, against addresses where nothing
// listens (127.0.0.1:1 for each lab address): each must get past its flag
// parsing (exit 1, a failure to reach the cluster, never 2, a usage error).
func TestTroubleshootingCommandsAreReal(t *testing.T) {
	bin := buildCarve(t)
	text, err := os.ReadFile(filepath.Join(repoRoot, troubleshootingDoc))
	if err != nil {
		t.Fatal(err)
	}
	m := opVariable.FindSubmatch(text)
	if m == nil {
		t.Fatalf("%s sets no OP='...'", troubleshootingDoc)
	}
	ca := pkitest.New(t)
	op := ca.Files("alice", pki.RoleOperator)
	files := strings.NewReplacer("ca.pem", op.CA, "alice-key.pem", op.Key, "alice.pem", op.Cert)
	expand := func(line string) []string {
		line = strings.ReplaceAll(line, "$OP", string(m[1]))
		line = labAddress.ReplaceAllString(line, "127.0.0.1:1")
		var words []string
		for _, w := range strings.Fields(line) {
			if strings.HasPrefix(w, "#") {
				break
			}
			words = append(words, files.Replace(w))
		}
		return words
	}
	var ran int
	inCode := false
	for _, line := range strings.Split(string(text), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			inCode = !inCode
			continue
		}
		if !inCode || !strings.HasPrefix(trimmed, "carve ") {
			continue
		}
		words := expand(trimmed)
		if words[1] == "ipam" && words[2] == "release" {
			words = append(words, "--socket", filepath.Join(t.TempDir(), "agent.sock"))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, words[1:]...)
		out, err := cmd.CombinedOutput()
		cancel()
		var exit *exec.ExitError
		switch {
		case err == nil:
		case !errors.As(err, &exit):
			t.Errorf("%s: %v", trimmed, err)
		case exit.ExitCode() == 2:
			t.Errorf("%s: a usage error:\n%s", trimmed, out)
		}
		ran++
	}
	if ran < 5 {
		t.Fatalf("only %d carve commands found in %s", ran, troubleshootingDoc)
	}
	t.Logf("%d commands of %s parsed", ran, troubleshootingDoc)
}
