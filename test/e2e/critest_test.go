package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/containerdlab"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// critestFocus selects critest's Networking and PodSandbox specs and its
// two port forward specs (ginkgo matches it against "[k8s.io] <Describe>
// <Context> <It>"): port forwarding dials into the pod's network
// namespace, or the host's for a host network pod.
const critestFocus = `\[k8s\.io\] (Networking|PodSandbox) |runtime should support portforward`

// critestSpecs are the specs critestFocus selects in critest v1.34, as
// "<Describe> | <It>": the test fails unless every one of them ran and
// passed, so that a focus matching nothing (a renamed spec, a new
// version) does not pass silently.
var critestSpecs = []string{
	"[k8s.io] Networking | runtime should support DNS config [Conformance]",
	"[k8s.io] Networking | runtime should support set hostname [Conformance]",
	"[k8s.io] Networking | runtime should support port mapping with only container port [Conformance]",
	"[k8s.io] Networking | runtime should support port mapping with host port and container port [Conformance]",
	"[k8s.io] PodSandbox | runtime should support running PodSandbox [Conformance]",
	"[k8s.io] PodSandbox | runtime should support stopping PodSandbox [Conformance]",
	"[k8s.io] PodSandbox | runtime should support removing PodSandbox [Conformance]",
	"[k8s.io] PodSandbox | should support safe sysctls",
	"[k8s.io] PodSandbox | should support unsafe sysctls",
	"[k8s.io] Streaming | runtime should support portforward [Conformance]",
	"[k8s.io] Streaming | runtime should support portforward in host network",
}

// TestCritest is issue 28's guard: the upstream CRI validation suite,
// critest (cri-tools at the version go.mod pins for crictl), runs its
// Networking, PodSandbox and port forward specs against Debian's
// containerd whose pods get carve's network: a one-host cluster (a master, an agent, TLS) whose
// agent writes its conflist into containerd's conf_dir, the plugins those
// of a stock Debian host with carve-ipam (as TestEngines). critest pulls
// nothing: the images its specs run are built from the static busybox and
// imported under the names critest asks for
// (containerdlab.ImportCritestImages). critest runs in the lab host's
// network namespace, so that its GETs of the pod's address and of
// 127.0.0.1's host port go through carve's bridge and portmap there. The
// test fails when any of critestSpecs did not run or did not pass, and
// logs every spec's outcome and critest's summary.
func TestCritest(t *testing.T) {
	requireCritest(t)
	start := time.Now()
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	// Both builds while the cluster starts: they are the slow part of a
	// cold run (critest is a test binary: go test -c). A test that stops
	// early cancels them and waits for them before work is removed.
	type built struct {
		path string
		err  error
	}
	crictlc, critestc := make(chan built, 1), make(chan built, 1)
	var builds sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		builds.Wait()
	})
	builds.Go(func() {
		p, err := labcluster.BuildTool(ctx, work, "sigs.k8s.io/cri-tools/cmd/crictl")
		crictlc <- built{p, err}
	})
	builds.Go(func() {
		p, err := buildCritest(ctx, work)
		critestc <- built{p, err}
	})
	plugins := debianPluginDir(t, work)
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 1, Masters: 1, Prefix: prefix,
		CNIVersion: "auto", CNIBinDirs: []string{plugins}})
	const overlay = "carve"
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h := c.Host(1)
	requireConflistVersion(ctx, t, h, overlay, netconf.BaseCNIVersion)
	crictl, critest := <-crictlc, <-critestc
	if crictl.err != nil {
		t.Fatal(crictl.err)
	}
	if critest.err != nil {
		t.Fatal(critest.err)
	}
	t.Logf("cluster up and critest built in %v", time.Since(start).Round(time.Second))

	containerdlab.RemoveCritestCgroupsAtCleanup(t)
	ctd, err := containerdlab.Start(ctx, t, h.NS, containerdlab.Options{CNIConfDir: h.CNIConfDir(), CNIBinDir: plugins, Crictl: crictl.path})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Log(ctd.LogTail(4000))
		}
	}()
	if err := ctd.ImportCritestImages(ctx); err != nil {
		t.Fatal(err)
	}

	report := filepath.Join(work, "critest.json")
	cmd := exec.CommandContext(ctx, critest.path,
		"-runtime-endpoint", "unix://"+ctd.Socket(), "-image-endpoint", "unix://"+ctd.Socket(),
		// No config file of the machine's: the endpoints are the flags.
		"-config", filepath.Join(work, "no-crictl.yaml"),
		"-ginkgo.focus", critestFocus, "-ginkgo.no-color", "-ginkgo.json-report", report)
	cmd.Dir = work
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runStart := time.Now()
	runErr := h.NS.Run(cmd)
	t.Logf("critest ran in %v (%v in all): %s", time.Since(runStart).Round(time.Second),
		time.Since(start).Round(time.Second), critestSummary(out.String()))

	specs, err := readCritestReport(report)
	if err != nil {
		t.Fatalf("critest (%v) wrote no report: %v\n%s", runErr, err, out.String())
	}
	ran := map[string]critestSpec{}
	for _, s := range specs {
		if s.LeafNodeType != "It" {
			if s.State != "passed" {
				t.Errorf("critest's %s: %s: %s", s.LeafNodeType, s.State, s.Failure.Message)
			}
			continue
		}
		if s.State == "skipped" {
			continue
		}
		ran[s.name()] = s
		t.Logf("%-8s %5.1fs  %s", s.State, time.Duration(s.RunTime).Seconds(), s.name())
		if s.State != "passed" {
			t.Errorf("critest: %s %s: %s (%s:%d)", s.name(), s.State, s.Failure.Message,
				filepath.Base(s.Failure.Location.FileName), s.Failure.Location.LineNumber)
		}
	}
	for _, want := range critestSpecs {
		if _, ok := ran[want]; !ok {
			t.Errorf("critest did not run %q (the focus %q selects another set: update critestSpecs)", want, critestFocus)
		}
	}
	for name := range ran {
		if !slices.Contains(critestSpecs, name) {
			t.Errorf("critest ran %q, which critestSpecs does not list: add it", name)
		}
	}
	// The pod critest GETs by its address got it from carve: an address of
	// the agent's bridge.
	s := ran["[k8s.io] Networking | runtime should support port mapping with only container port [Conformance]"]
	if m := critestURL.FindStringSubmatch(s.CapturedGinkgoWriterOutput); m != nil {
		ip, err := netip.ParseAddr(m[1])
		if err == nil {
			err = onBridge(ip, mesosBridge(ctx, t, c, h, overlay))
		}
		if err != nil {
			t.Errorf("critest's pod address %q: %v", m[1], err)
		} else {
			t.Logf("critest's web server pod had %s, an address of carve's bridge on %s", ip, h.Name)
		}
	} else if s.State == "passed" {
		t.Errorf("critest logged no pod address (no %q in %q)", critestURL, s.CapturedGinkgoWriterOutput)
	}
	// Every pod removed, carve holds nothing: each DEL released.
	if got := allocations(ctx, t, c, h, overlay); len(got) != 0 {
		t.Errorf("%s's agent still holds %v after critest removed its pods", h.Name, got)
	}
	if rep, code := ipamCheck(ctx, t, c); code != 0 || !rep.Clean {
		t.Errorf("carve ipam check after critest: exit %d, clean %v, problems %+v", code, rep.Clean, rep.Problems)
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("critest: %v", runErr)
	}
	if t.Failed() {
		t.Logf("critest's output:\n%s", out.String())
	}
}

// requireCritest stops the test when the machine lacks containerd, the
// static busybox or Debian's plugins (testutil.Require: a skip, a failure
// under CI).
func requireCritest(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := containerdlab.Binaries(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := enginelab.StaticBusybox(); err != nil {
		missing = append(missing, err.Error())
	}
	for _, p := range []string{"bridge", "portmap", "loopback", "host-local"} {
		if _, err := os.Stat(filepath.Join(netconf.DebianBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(netconf.DebianBinDir, p)+" (apt-get install containernetworking-plugins)")
		}
	}
	testutil.Require(t, len(missing) == 0, "e2e: critest: missing %s (deploy/install-deps.sh installs them)", strings.Join(missing, "; "))
}

// buildCritest builds critest, the test binary of
// sigs.k8s.io/cri-tools/cmd/critest (it has no non-test Go files), at the
// version go.mod pins, into dir.
func buildCritest(ctx context.Context, dir string) (string, error) {
	root, err := labcluster.ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = "/usr/local/go/bin/go"
	}
	out := filepath.Join(dir, "critest")
	cmd := exec.CommandContext(ctx, goCmd, "test", "-c", "-o", out, "sigs.k8s.io/cri-tools/cmd/critest")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go test -c sigs.k8s.io/cri-tools/cmd/critest: %w\n%s", err, msg)
	}
	return out, nil
}

// critestURL is how critest logs the address it GETs a pod at.
var critestURL = regexp.MustCompile(`the IP:port is http://([0-9.]+):80\b`)

// critestSpec is the part of a ginkgo JSON report's spec report the test
// reads.
type critestSpec struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	RunTime                 int64
	// CapturedGinkgoWriterOutput holds critest's framework.Logf lines.
	CapturedGinkgoWriterOutput string
	Failure                    struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

// name is "<Describe> | <It>".
func (s critestSpec) name() string {
	describe := ""
	if len(s.ContainerHierarchyTexts) > 0 {
		describe = s.ContainerHierarchyTexts[0]
	}
	return describe + " | " + s.LeafNodeText
}

// readCritestReport reads the spec reports of ginkgo's -json-report.
func readCritestReport(path string) ([]critestSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []struct{ SpecReports []critestSpec }
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var specs []critestSpec
	for _, r := range reports {
		specs = append(specs, r.SpecReports...)
	}
	return specs, nil
}

// critestSummary is ginkgo's summary lines ("Ran 9 of 83 Specs in ...",
// "SUCCESS! -- 9 Passed | 0 Failed | ...").
func critestSummary(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "Ran ") || strings.Contains(l, " Passed | ") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "(no summary)"
	}
	return strings.Join(lines, "; ")
}
