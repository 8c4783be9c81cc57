package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

// raftHarness are the files of hashicorp/raft that third_party/raft leaves
// out (third_party/raft/PATCHED.md): they import testing with no build tag,
// so linking raft would link package testing into bin/carve.
var raftHarness = []string{"testing.go", "testing_batch.go"}

// TestRaftForkIsUpstreamLessItsHarness: third_party/raft, which replaces
// hashicorp/raft in go.mod, holds exactly the pinned release's non-test Go
// files, go.mod and LICENSE, byte for byte, less raftHarness, plus its
// PATCHED.md. Any other change to the fork, or a pin moved without
// refreshing it, fails here; and if upstream stops shipping the harness
// files, the fork is no longer needed and this says so.
func TestRaftForkIsUpstreamLessItsHarness(t *testing.T) {
	const module = "github.com/hashicorp/raft"
	var mod struct {
		Version string
		Replace *struct{ Dir string }
	}
	goJSON(t, &mod, "list", "-m", "-json", module)
	if mod.Replace == nil || mod.Replace.Dir == "" {
		t.Fatalf("go.mod does not replace %s: remove third_party/raft and this test, or restore the replace", module)
	}
	var dl struct{ Dir, Error string }
	out, err := exec.Command(goTool, "mod", "download", "-json", module+"@"+mod.Version).Output()
	if err == nil {
		err = json.Unmarshal(out, &dl)
	}
	testutil.Require(t, err == nil && dl.Error == "" && dl.Dir != "",
		"%s@%s cannot be downloaded from the Go module proxy to compare the fork with: %v %s", module, mod.Version, err, dl.Error)

	upstream := moduleFiles(t, dl.Dir, func(rel string) bool {
		base := filepath.Base(rel)
		return rel == "go.mod" || rel == "LICENSE" ||
			strings.HasSuffix(base, ".go") && !strings.HasSuffix(base, "_test.go")
	})
	for _, h := range raftHarness {
		if _, ok := upstream[h]; !ok {
			t.Errorf("%s@%s has no %s any more: the fork may be unneeded (see third_party/raft/PATCHED.md)", module, mod.Version, h)
		}
		delete(upstream, h)
	}
	fork := moduleFiles(t, mod.Replace.Dir, func(rel string) bool { return rel != "PATCHED.md" })
	for _, rel := range slices.Sorted(maps.Keys(upstream)) {
		got, ok := fork[rel]
		switch {
		case !ok:
			t.Errorf("third_party/raft lacks %s of %s@%s", rel, module, mod.Version)
		case !bytes.Equal(got, upstream[rel]):
			t.Errorf("third_party/raft/%s differs from %s@%s", rel, module, mod.Version)
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(fork)) {
		if _, ok := upstream[rel]; !ok {
			t.Errorf("third_party/raft/%s is not a file of %s@%s that the fork keeps", rel, module, mod.Version)
		}
	}
}

// goJSON runs the go command with args and decodes its JSON output into v.
func goJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := exec.Command(goTool, args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
}

// moduleFiles reads the files under root (path relative to root) that keep
// says belong, leaving out nested modules.
func moduleFiles(t *testing.T, root string, keep func(rel string) bool) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || !keep(filepath.ToSlash(rel)) {
			return err
		}
		data, err := os.ReadFile(path)
		files[filepath.ToSlash(rel)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
