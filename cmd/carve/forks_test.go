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

// raftPatch is one change carve makes to a file of hashicorp/raft, named
// and argued in third_party/raft/PATCHED.md: the upstream text and what
// replaces it, each exactly once.
type raftPatch struct {
	file, upstream, carve string
}

// raftPatches are every change the fork makes; the test applies them to the
// pinned release and then requires the fork to equal it byte for byte.
var raftPatches = []raftPatch{{
	// A follower commits only what the leader's request verified.
	file: "raft.go",
	upstream: `	// Update the commit index
	if a.LeaderCommitIndex > 0 && a.LeaderCommitIndex > r.getCommitIndex() {
		start := time.Now()
		idx := min(a.LeaderCommitIndex, r.getLastIndex())
		r.setCommitIndex(idx)`,
	carve: `	// Update the commit index. carve: only up to the last entry this request
	// verified (the Raft paper's "index of last new entry"), never the
	// follower's last index, which may end in entries of an older term that
	// no leader committed (see PATCHED.md).
	verified := a.PrevLogEntry
	if n := len(a.Entries); n > 0 {
		verified = a.Entries[n-1].Index
	}
	if idx := min(a.LeaderCommitIndex, verified); a.LeaderCommitIndex > 0 && idx > r.getCommitIndex() {
		start := time.Now()
		r.setCommitIndex(idx)`,
}, {
	// A removed follower is sent its removal more than once.
	file: "replication.go",
	upstream: `		case maxIndex := <-s.stopCh:
			// Make a best effort to replicate up to this index
			if maxIndex > 0 {
				r.replicateTo(s, maxIndex)
			}
			return
		case deferErr := <-s.triggerDeferErrorCh:`,
	carve: `		case maxIndex := <-s.stopCh:
			// Make a best effort to replicate up to this index. carve: until
			// the follower holds it, for up to a minute (see PATCHED.md): a
			// removed follower learns its removal only from these entries,
			// and one try fails whenever its log was behind or the request
			// was lost; under load, a count of tries ran out first.
			for deadline := time.Now().Add(time.Minute); maxIndex > 0 && time.Now().Before(deadline) && atomic.LoadUint64(&s.nextIndex) <= maxIndex && r.getState() == Leader; {
				r.replicateTo(s, maxIndex)
			}
			return
		case deferErr := <-s.triggerDeferErrorCh:`,
}, {
	// A leader sends a removed server that campaigns its removal: the
	// removals under way, per server.
	file: "raft.go",
	upstream: `	notify                       map[*verifyFuture]struct{}
	stepDown                     chan struct{}
}
`,
	carve: `	notify                       map[*verifyFuture]struct{}
	stepDown                     chan struct{}
	// removals holds, per server outside the configuration that asked for
	// a vote, a channel closed once sendRemoval's try ended. carve's (see
	// PATCHED.md).
	removals map[ServerID]chan struct{}
}
`,
}, {
	// ... kept per leadership.
	file: "raft.go",
	upstream: `	r.leaderState.stepDown = make(chan struct{}, 1)
}
`,
	carve: `	r.leaderState.stepDown = make(chan struct{}, 1)
	r.leaderState.removals = make(map[ServerID]chan struct{}) // carve's (see PATCHED.md)
}
`,
}, {
	// ... when it asks for a vote,
	file: "raft.go",
	upstream: `			r.logger.Warn("rejecting vote request since node is not in configuration",
				"from", candidate)
			return`,
	carve: `			r.logger.Warn("rejecting vote request since node is not in configuration",
				"from", candidate)
			r.sendRemoval(candidateID, candidate) // carve's (see PATCHED.md)
			return`,
}, {
	// ... or for a pre-vote.
	file: "raft.go",
	upstream: `		r.logger.Warn("rejecting pre-vote request since node is not in configuration",
			"from", candidate)
		return`,
	carve: `		r.logger.Warn("rejecting pre-vote request since node is not in configuration",
			"from", candidate)
		r.sendRemoval(candidateID, candidate) // carve's (see PATCHED.md)
		return`,
}, {
	// ... by sendRemoval.
	file: "replication.go",
	upstream: `// replicateTo is a helper to replicate(), used to replicate the logs up to a
// given last index.
`,
	carve: `// sendRemoval is carve's (see PATCHED.md). A leader that hears a vote or
// pre-vote request from a server outside its configuration sends it the log
// up to that configuration, from which it learns that it was removed: the
// leader that removed it tries only while it leads, and a leader elected
// after never contacts it, so a removal that missed it left it campaigning
// in vain. One try at a time per server. The follower's answer moves only
// this try: a higher term in it must not depose this leader, which is why
// the try has its own stepDown, commitment and stop channels. This must only
// be called from the main thread.
func (r *Raft) sendRemoval(id ServerID, addr ServerAddress) {
	if r.getState() != Leader || addr == "" {
		return
	}
	if done, ok := r.leaderState.removals[id]; ok {
		select {
		case <-done:
		default:
			return // a try is under way
		}
	}
	done := make(chan struct{})
	r.leaderState.removals[id] = done
	last := r.configurations.latestIndex
	s := &followerReplication{
		peer:                Server{Suffrage: Nonvoter, ID: id, Address: addr},
		commitment:          newCommitment(make(chan struct{}, 1), Configuration{}, 0),
		stopCh:              make(chan uint64, 1),
		triggerCh:           make(chan struct{}, 1),
		triggerDeferErrorCh: make(chan *deferError, 1),
		currentTerm:         r.getCurrentTerm(),
		nextIndex:           last,
		lastContact:         time.Now(),
		notify:              make(map[*verifyFuture]struct{}),
		notifyCh:            make(chan struct{}, 1),
		stepDown:            make(chan struct{}, 1),
	}
	r.logger.Info("sending a removed server its removal", "peer", id, "address", addr, "last-index", last)
	r.goFunc(func() {
		defer close(done)
		r.replicateTo(s, last)
	})
}

// replicateTo is a helper to replicate(), used to replicate the logs up to a
// given last index.
`,
}}

// TestRaftForkIsUpstreamLessItsHarness: third_party/raft, which replaces
// hashicorp/raft in go.mod, holds exactly the pinned release's non-test Go
// files, go.mod and LICENSE, byte for byte, less raftHarness and with
// raftPatches applied, plus its PATCHED.md. Any other change to the fork, or a pin moved without
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
	for _, p := range raftPatches {
		text := string(upstream[p.file])
		if strings.Count(text, p.upstream) != 1 {
			t.Errorf("%s@%s's %s no longer holds the text carve patches exactly once: check the patch in third_party/raft/PATCHED.md against this release", module, mod.Version, p.file)
			continue
		}
		upstream[p.file] = []byte(strings.Replace(text, p.upstream, p.carve, 1))
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
