package main

import (
	"os/exec"
	"strings"
	"testing"
)

// notInCarve are packages that belong to carve-ipam or the tests, never to
// bin/carve: libcni (a CNI runtime) and the CNI plugin itself (the agent
// writes conflists with cni/netconf alone).
var notInCarve = []string{
	"github.com/carve-net/carve/cni",
	"github.com/containernetworking/cni/libcni",
}

// labTree holds the lab and the test harness (cmd/carve-lab, the tests and
// the benches): no package under it ships in bin/carve.
const labTree = "github.com/carve-net/carve/internal/lab/"

// TestNoLabInProductionBinary fails when bin/carve links a package of the
// lab or a package that imports testing: `carve demo` execs bin/carve-lab
// instead of linking the harness.
func TestNoLabInProductionBinary(t *testing.T) {
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}",
		"github.com/carve-net/carve/cmd/carve").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/carve: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		deps[fields[0]] = true
		for _, imp := range fields[1:] {
			if imp == "testing" {
				t.Errorf("cmd/carve links %s, which imports testing", fields[0])
			}
		}
	}
	if !deps["github.com/carve-net/carve/agent"] || !deps["github.com/carve-net/carve/master"] {
		t.Fatalf("go list -deps ./cmd/carve lacks the agent or the master; output:\n%s", out)
	}
	if deps["testing"] {
		t.Errorf("cmd/carve links package testing")
	}
	for p := range deps {
		if strings.HasPrefix(p, labTree) {
			t.Errorf("cmd/carve links %s: the lab and the test harness belong to cmd/carve-lab and the tests", p)
		}
	}
	for _, p := range notInCarve {
		if deps[p] {
			t.Errorf("cmd/carve links %s, which belongs to cmd/carve-lab, cmd/carve-ipam or the tests", p)
		}
	}
}

// goTool is the go command of the toolchain running the tests: go test puts
// that toolchain's bin directory first on the test's PATH.
const goTool = "go"
