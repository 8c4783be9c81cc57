package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// notInCarve are packages that belong to carve-ipam or the tests, never to
// bin/carve: libcni (a CNI runtime) and the CNI plugin itself (the agent
// writes conflists with cni/netconf alone).
var notInCarve = []string{
	module + "/cni",
	"github.com/containernetworking/cni/libcni",
}

// module is carve's module path; testTree is the one root of what does not
// ship (the lab, the test harness, the end-to-end tests, the benches and
// bin/carve-lab).
const (
	module   = "github.com/carve-net/carve"
	testTree = module + "/test/"
)

// shippedCommands are the only main packages under cmd/: each is a binary
// that ships.
var shippedCommands = map[string]bool{
	module + "/cmd/carve":      true,
	module + "/cmd/carve-ipam": true,
}

// innerTree lists the roots internal/ must never import: dependencies point
// inward, so the shared helpers know nothing of the daemons that use them.
var innerTree = []string{module + "/agent", module + "/master", module + "/raftlog", module + "/cmd/", module + "/test/"}

// stateParts are the packages cut out of master/state (issue 30), each
// with the only packages of ours it may import: master/state consumes
// them, so none of them imports master/state, the master process or
// anything that does I/O beyond its job.
var stateParts = map[string][]string{
	module + "/master/agenttrust": {module + "/api", module + "/master/record"},
	module + "/master/changelog":  nil,
	module + "/master/denylist":   {module + "/api"},
	module + "/master/logcmd":     {module + "/api", module + "/master/netconfig", module + "/master/record"},
	module + "/master/netconfig":  {module + "/api"},
	module + "/master/record":     {module + "/api", module + "/master/netconfig", module + "/prefixspace"},
	module + "/master/recordsign": {module + "/api"},
	module + "/master/snapshot":   {module + "/api", module + "/master/logcmd", module + "/master/record"},
	module + "/master/usage":      {module + "/api", module + "/master/netconfig"},
}

// agentDaemon is the agent daemon's package: it wires its parts, which
// never import it (no package under agent/ does).
const agentDaemon = module + "/agent"

// agentParts are the parts of the agent moved out of package agent, each
// with one job; of what is under agent/ they import only these (the
// membership's records), so that each can be read and tested alone.
var agentParts = map[string][]string{
	module + "/agent/store":      {module + "/agent/membership"},
	module + "/agent/kernel":     {module + "/agent/membership"},
	module + "/agent/report":     nil,
	module + "/agent/ipamview":   nil,
	module + "/agent/meshpeers":  {module + "/agent/membership"},
	module + "/agent/encryption": {module + "/agent/membership"},
}

// ipamService is the IPAM's package: the parts cut out of it never import it.
const ipamService = module + "/agent/ipam"

// ipamParts are the packages cut out of agent/ipam (issue 30), each with
// one job behind a narrow interface the IPAM implements; of agent/ipam's
// tree they import only what they list (the wire format, the store's
// records), never agent/ipam itself.
var ipamParts = map[string][]string{
	module + "/agent/ipam/blockaddr":    nil,
	module + "/agent/ipam/capacity":     nil,
	module + "/agent/ipam/claimkeys":    {module + "/agent/ipam/ipamwire"},
	module + "/agent/ipam/groupcommit":  nil,
	module + "/agent/ipam/growth":       {module + "/agent/ipam/ipamwire", module + "/agent/ipam/ipfamily", module + "/agent/ipam/ringgossip"},
	module + "/agent/ipam/ipamsock":     nil,
	module + "/agent/ipam/ipammetrics":  {module + "/agent/ipam/claimkeys", module + "/agent/ipam/ringgossip"},
	module + "/agent/ipam/ipamstore":    {module + "/agent/ipam/ipfamily"},
	module + "/agent/ipam/ipamvalidate": {module + "/agent/ipam/ipfamily"},
	module + "/agent/ipam/ipfamily":     nil,
	module + "/agent/ipam/masterreport": {module + "/agent/ipam/ipamstore"},
	module + "/agent/ipam/overlayspace": {module + "/agent/ipam/blockaddr", module + "/agent/ipam/claimkeys", module + "/agent/ipam/ipamstore", module + "/agent/ipam/ipfamily"},
	module + "/agent/ipam/reclaimwatch": nil,
	module + "/agent/ipam/ringgossip":   {module + "/agent/ipam/ipamwire"},
	module + "/agent/ipam/spaceask":     {module + "/agent/ipam/ipamwire", module + "/agent/ipam/ipfamily"},
}

// commandFamilies are the subcommand families of bin/carve moved out of
// package main (issue 30), each with the only packages of the daemons'
// trees (agent/, master/, raftlog/) it may import: an operator command
// reads the cluster through its APIs, never links the daemons.
var commandFamilies = map[string][]string{
	module + "/ipamcmd": {module + "/agent/dockeripam"},
}

// daemonTrees are the roots commandFamilies restricts.
var daemonTrees = []string{module + "/agent", module + "/master", module + "/raftlog"}

// listPackages runs go list -deps (or plain go list) with a format printing
// each package's path, its name and its non-test imports.
func listPackages(t *testing.T, deps bool, pattern string) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", "{{.ImportPath}} {{.Name}} {{join .Imports \" \"}}"}
	if deps {
		args = append(args, "-deps")
	}
	out, err := exec.Command(goTool, append(args, pattern)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if fields := strings.Fields(line); len(fields) >= 2 {
			pkgs[fields[0]] = fields[1:]
		}
	}
	return pkgs
}

// TestNoLabInProductionBinary fails when bin/carve links a package under
// test/ or a package that imports testing: `carve demo` execs bin/carve-lab
// instead of linking the harness.
func TestNoLabInProductionBinary(t *testing.T) {
	deps := listPackages(t, true, module+"/cmd/carve")
	if deps[module+"/agent"] == nil || deps[module+"/master"] == nil {
		t.Fatalf("go list -deps ./cmd/carve lacks the agent or the master: %d packages", len(deps))
	}
	if deps["testing"] != nil {
		t.Errorf("cmd/carve links package testing")
	}
	for p, nameAndImports := range deps {
		if strings.HasPrefix(p, testTree) {
			t.Errorf("cmd/carve links %s: what is under test/ belongs to bin/carve-lab and the tests", p)
		}
		for _, imp := range nameAndImports[1:] {
			if imp == "testing" {
				t.Errorf("cmd/carve links %s, which imports testing", p)
			}
		}
	}
	for _, p := range notInCarve {
		if deps[p] != nil {
			t.Errorf("cmd/carve links %s, which belongs to cmd/carve-ipam or the tests", p)
		}
	}
}

// TestDependenciesPointInward is the tree's import rule as prefixes, over
// every package of the module (non-test imports): nothing outside test/
// imports test/; internal/ imports nothing of agent/, master/, raftlog/,
// cmd/ or test/; the parts of master/state (stateParts) import only what
// they list; nothing under agent/ imports the agent daemon, and the
// agent's parts (agentParts) import of agent/ only what they list, and the
// IPAM's parts (ipamParts) of agent/ipam/ only what they list; the
// command families (commandFamilies) of agent/, master/ and raftlog/ only
// what they list; cmd/ holds only the shipped binaries.
func TestDependenciesPointInward(t *testing.T) {
	pkgs := listPackages(t, false, module+"/...")
	if len(pkgs) < 20 {
		t.Fatalf("go list %s/... found only %d packages", module, len(pkgs))
	}
	for p := range stateParts {
		if pkgs[p] == nil {
			t.Errorf("%s, a part of master/state, is not in the module", p)
		}
	}
	for p := range ipamParts {
		if pkgs[p] == nil {
			t.Errorf("%s, a part of agent/ipam, is not in the module", p)
		}
	}
	for p := range commandFamilies {
		if pkgs[p] == nil {
			t.Errorf("%s, a command family of bin/carve, is not in the module", p)
		}
	}
	for p, nameAndImports := range pkgs {
		name, imports := nameAndImports[0], nameAndImports[1:]
		if strings.HasPrefix(p, module+"/cmd/") && (!shippedCommands[p] || name != "main") {
			t.Errorf("%s is under cmd/, which holds only the shipped binaries; a lab or test command belongs under test/cmd/", p)
		}
		for _, imp := range imports {
			if allowed, ok := stateParts[p]; ok && strings.HasPrefix(imp, module+"/") && !slices.Contains(allowed, imp) {
				t.Errorf("%s imports %s: a part of master/state imports only %v (master/state consumes it, not the other way)", p, imp, allowed)
			}
			if !strings.HasPrefix(p, testTree) && strings.HasPrefix(imp, testTree) {
				t.Errorf("%s imports %s: a shipped package never imports test/", p, imp)
			}
			if strings.HasPrefix(p, agentDaemon+"/") && imp == agentDaemon {
				t.Errorf("%s imports %s: the agent daemon wires the packages under agent/, which never import it", p, imp)
			}
			if allowed, ok := agentParts[p]; ok && strings.HasPrefix(imp, agentDaemon+"/") && !slices.Contains(allowed, imp) {
				t.Errorf("%s imports %s: of agent/, it imports only %v (add the dependency to agentParts, and say why, if it belongs)", p, imp, allowed)
			}
			if allowed, ok := ipamParts[p]; ok && (imp == ipamService || strings.HasPrefix(imp, ipamService+"/")) && !slices.Contains(allowed, imp) {
				t.Errorf("%s imports %s: of agent/ipam/, it imports only %v (the IPAM wires its parts, which never import it; add the dependency to ipamParts, and say why, if it belongs)", p, imp, allowed)
			}
			if allowed, ok := commandFamilies[p]; ok && !slices.Contains(allowed, imp) && slices.ContainsFunc(daemonTrees, func(root string) bool { return imp == root || strings.HasPrefix(imp, root+"/") }) {
				t.Errorf("%s imports %s: a command family imports of agent/, master/ and raftlog/ only %v (it reads the cluster through its APIs)", p, imp, allowed)
			}
			if strings.HasPrefix(p, module+"/internal/") {
				for _, outer := range innerTree {
					if imp == outer || strings.HasPrefix(imp, outer+"/") || strings.HasPrefix(imp, outer) && strings.HasSuffix(outer, "/") {
						t.Errorf("%s imports %s: internal/ holds the shared helpers and imports nothing of %s", p, imp, strings.TrimPrefix(outer, module+"/"))
					}
				}
			}
		}
	}
}

// goTool is the go command of the toolchain running the tests: go test puts
// that toolchain's bin directory first on the test's PATH.
const goTool = "go"
