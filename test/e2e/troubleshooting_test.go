package e2e

// docs/troubleshooting.md run on the faults it names (issue 27): each test
// causes a section's fault on a lab cluster, runs the commands of the
// section's code blocks as the guide writes them (read from the file, so
// that the guide and the test cannot drift), checks that they show the
// fault as the section says, applies the section's fix and checks that
// the cluster recovers.
//
// The commands run with sh inside the namespace of the host the section
// says, in a directory holding the operator's files under the guide's
// names (ca.pem, alice.pem, alice-key.pem), with carve on PATH and OP set
// as the guide sets it but for the masters' URLs, the lab's. The guide's
// example values that differ in the lab (a container's address, a host's
// file paths) are replaced word for word; journalctl reads the log of the
// process it names on that host. A command the lab cannot run
// (systemctl: no units; a program not installed; tcpdump, which waits for
// traffic) is skipped, and the test says so.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestTroubleshootingVXLANDrop: a rule in host 1's INPUT chain drops udp
// 4789 (in its namespace). Its containers reach no other host's; the
// section's commands show every peer programmed and the rule; its fix,
// run on host 1, lets the pings through.
func TestTroubleshootingVXLANDrop(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "VXLAN packets dropped between hosts")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cs)
	h1 := c.Host(1)
	if h1.IP().Addr().String() != "198.18.0.11" {
		t.Fatalf("host 1 is at %s; the guide's commands name 198.18.0.11", h1.IP())
	}

	if _, err := hostIptables(ctx, h1, "iptables", "-A", "INPUT", "-p", "udp", "--dport", "4789", "-j", "DROP"); err != nil {
		t.Fatal(err)
	}
	if m := labcluster.Ping(ctx, []*labcluster.Container{cs[0], cs[1]}); m.Err() == nil {
		t.Fatalf("pings cross a host that drops udp 4789:\n%s", m)
	}

	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "curl ")
	requireCommand(t, cmds, "iptables -S INPUT")
	res := o.runAll(ctx, t, h1, cmds, nil)
	var peers api.AgentPeers
	if err := json.Unmarshal([]byte(startingWith(t, res, "curl ").out), &peers); err != nil {
		t.Fatalf("the peers of host 1: %v", err)
	}
	if len(peers.Peers) != 2 {
		t.Errorf("host 1 lists %d peers, want 2: %+v", len(peers.Peers), peers.Peers)
	}
	for _, p := range peers.Peers {
		if !p.Programmed {
			t.Errorf("host 1 has not programmed %s: the section says every peer shows programmed: true", p.AgentID)
		}
	}
	if out := startingWith(t, res, "iptables -S INPUT").out; !strings.Contains(out, "--dport 4789 -j DROP") {
		t.Errorf("iptables -S INPUT does not show the rule dropping udp 4789:\n%s", out)
	}

	fixes := codeLines(sec.Fixes)
	requireCommand(t, fixes, "iptables -I INPUT")
	for _, l := range fixes {
		if r, ok := o.run(ctx, t, h1, l, nil); ok && r.exited != 0 {
			t.Fatalf("the fix %q failed: %s", l, r.out)
		}
	}
	waitPings(ctx, t, cs)
}

// TestTroubleshootingAgentRefusesMasters: host 3's agent restarts pinned
// to another cluster's signing.pub. It refuses the masters' state as the
// section's symptom says; the section's commands show the refusal, the
// two keys differing and the masters healthy; restarted with the masters'
// signing.pub (the fix), it follows them again and its containers ping.
func TestTroubleshootingAgentRefusesMasters(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "An agent that refuses the masters")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cs)
	h3 := c.Host(3)

	other := t.TempDir() // another cluster's CA and signing key
	if err := pki.CreateCA(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h3, "--signing-pub-file", filepath.Join(other, pki.SignPub)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, converge, "host 3's agent refuses the masters", func() error {
		refused, err := labcluster.MetricSample(ctx, c.HTTPClient(), h3.AgentURL(), `carve_agent_master_states_refused_total{reason="signing_key"}`)
		if err != nil {
			return err
		}
		reachable, err := labcluster.MetricSample(ctx, c.HTTPClient(), h3.AgentURL(), "carve_agent_masters_reachable")
		if err != nil {
			return err
		}
		if refused == 0 || reachable != 0 {
			return fmt.Errorf("refused %v, reachable %v", refused, reachable)
		}
		return nil
	})

	// The masters learn of the refusal from the agent's next report: the
	// section's symptom is cluster status naming it (CI once ran the
	// commands before that report and saw "healthy").
	refusal := "refuse the masters' records"
	if !strings.Contains(sec.Symptom, refusal) {
		t.Fatalf("the section's symptom no longer quotes cluster status's %q:\n%s", refusal, sec.Symptom)
	}
	statusArgs := append([]string{"cluster", "status", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	testutil.Eventually(t, converge, "cluster status names host 3's agent refusing", func() error {
		out, err := c.RunCarve(ctx, c.Host(1), statusArgs...)
		if err == nil || !strings.Contains(string(out), refusal) || !strings.Contains(string(out), h3.AgentID()) {
			return fmt.Errorf("exit %v:\n%s", err, out)
		}
		return nil
	})

	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "journalctl -u carve-agent")
	requireCommand(t, cmds, "sha256sum /etc/carve/pki/signing.pub")
	requireCommand(t, cmds, "carve cluster status $OP")
	onAgent := o.runAll(ctx, t, h3, cmds, map[string]string{"/etc/carve/pki/": other + "/"})
	logged := inlineCommands(sec.Symptom, "ERROR ")
	if len(logged) == 0 {
		t.Fatalf("the section's symptom quotes no ERROR the agent logs:\n%s", sec.Symptom)
	}
	if out, msg := startingWith(t, onAgent, "journalctl -u carve-agent").out, strings.TrimPrefix(logged[0], "ERROR "); !strings.Contains(out, "level=ERROR msg=\""+msg) {
		t.Errorf("the agent's log does not say %q at ERROR, as the section quotes it:\n%s", msg, out)
	}
	if r := startingWith(t, onAgent, "carve cluster status"); r.exited != 1 || !strings.Contains(r.out, refusal) || !strings.Contains(r.out, h3.AgentID()) {
		t.Errorf("carve cluster status exited %d without naming %s as an agent that does %q, as the section's symptom says:\n%s", r.exited, h3.AgentID(), refusal, r.out)
	}
	// The same sum on the admin machine: the masters' key.
	sum := "sha256sum /etc/carve/pki/signing.pub"
	admin, _ := o.run(ctx, t, c.Host(1), startingWith(t, onAgent, sum).line, map[string]string{"/etc/carve/pki/": c.PKIDir() + "/"})
	agentSum, _, _ := strings.Cut(startingWith(t, onAgent, sum).out, " ")
	adminSum, _, _ := strings.Cut(admin.out, " ")
	if agentSum == "" || agentSum == adminSum {
		t.Errorf("sha256sum of the agent's signing.pub %q, the masters' %q: the section has the operator find them different", agentSum, adminSum)
	}

	// The fix: the masters' signing.pub (the harness's own flag), restarted.
	if !strings.Contains(sec.Fixes, "--signing-pub-file") || !strings.Contains(sec.Fixes, "restart it") {
		t.Fatalf("the section's fix no longer gives the agent the masters' signing.pub and restarts it:\n%s", sec.Fixes)
	}
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h3); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, converge, "host 3's agent reaches the masters", func() error {
		v, err := labcluster.MetricSample(ctx, c.HTTPClient(), h3.AgentURL(), "carve_agent_masters_reachable")
		if err == nil && v != 1 {
			err = fmt.Errorf("carve_agent_masters_reachable %v", v)
		}
		return err
	})
	testutil.Eventually(t, converge, "cluster status healthy again", func() error {
		if out, err := c.RunCarve(ctx, c.Host(1), statusArgs...); err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		return nil
	})
	waitPings(ctx, t, cs)
}

// TestTroubleshootingQuorum: two of three masters stopped. The section's
// commands show no leader; starting them (its first fix) makes the
// cluster healthy. Then m3 loses its data directory: its last fix, carve
// cluster remove m3 as the section writes it and m3 joined again with an
// empty data directory (--join), makes the cluster healthy again with m3
// a voter, and the containers ping throughout the masters' absence.
func TestTroubleshootingQuorum(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A master without quorum")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 6*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cs)
	ms := c.Masters()
	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "carve cluster status $OP")

	for _, m := range ms[1:] {
		if err := c.StopMaster(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// As soon as m1 has noticed that it hears no leader (the status
	// alone, then every command once).
	statusLine := startingWithLine(t, cmds, "carve cluster status")
	testutil.Eventually(t, converge, "carve cluster status shows the lost quorum", func() error {
		st, _ := o.run(ctx, t, c.Host(1), statusLine, nil)
		if st.exited != 1 || !problemNaming(st.out, "no leader") {
			return fmt.Errorf("carve cluster status with 1 master of 3 (exit %d) has no problem line saying no leader, as the section says:\n%s", st.exited, st.out)
		}
		return nil
	})
	res := o.runAll(ctx, t, c.Host(1), cmds, nil)
	st := startingWith(t, res, "carve cluster status")
	for _, m := range ms[1:] {
		if !problemNaming(st.out, m.URL()) {
			t.Errorf("carve cluster status names no problem with %s (%s), which is stopped:\n%s", m.ID, m.URL(), st.out)
		}
	}
	if out := startingWith(t, res, "journalctl -u carve-master").out; out == "" {
		t.Errorf("m1's log is empty")
	}
	// The problem lines the section quotes are the ones printed.
	examples := problemExamples(sec.Commands)
	if len(examples) < 3 {
		t.Fatalf("the section quotes %d problem lines, want the unreachable master, the master that sees no leader and no leader: %q", len(examples), examples)
	}
	for _, ex := range examples {
		if !matchesProblem(st.out, ex) {
			t.Errorf("the section quotes the problem line %q, which carve cluster status does not print:\n%s", ex, st.out)
		}
	}
	if !strings.Contains(sec.Fixes, "start the stopped masters") {
		t.Fatalf("the section's first fix no longer starts the stopped masters:\n%s", sec.Fixes)
	}
	pingAll(ctx, t, cs) // running containers keep their network, as the section says
	for _, m := range ms[1:] {
		if err := c.StartMaster(m); err != nil {
			t.Fatal(err)
		}
	}
	waitHealthy(ctx, t, c)

	// A master whose data directory was lost.
	m3 := ms[2]
	if err := c.StopMaster(ctx, m3); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(m3.DataDir); err != nil {
		t.Fatal(err)
	}
	remove := inlineCommands(sec.Fixes, "carve cluster remove")
	if len(remove) != 1 {
		t.Fatalf("the section's fixes name %d carve cluster remove commands, want 1: %q", len(remove), remove)
	}
	if !strings.Contains(remove[0], " m3 ") {
		t.Fatalf("the guide removes %q; this test lost m3's data dir", remove[0])
	}
	// m3 may have been the leader: until m1 and m2 elect one, the command
	// says to retry (no_leader, 503), and the operator does.
	testutil.Eventually(t, converge, remove[0], func() error {
		if r, _ := o.run(ctx, t, c.Host(1), remove[0], nil); r.exited != 0 {
			err := fmt.Errorf("%s: exit %d\n%s%s", remove[0], r.exited, r.out, r.stderr)
			if !strings.Contains(r.stderr, "no_leader") {
				return retry.Permanent(err)
			}
			return err
		}
		return nil
	})
	if !strings.Contains(strings.Join(strings.Fields(sec.Fixes), " "), "empty data directory and `CARVE_JOIN`") {
		t.Fatalf("the section no longer joins the master again with CARVE_JOIN:\n%s", sec.Fixes)
	}
	// CARVE_PEERS empty, CARVE_JOIN a running master (operations.md, section 6).
	if err := c.StartMasterWith(m3, "--peers", "", "--join", ms[0].URL()); err != nil {
		t.Fatal(err)
	}
	waitHealthy(ctx, t, c)
	out, _ := clusterStatus(ctx, t, c, "--json")
	var rep struct {
		Masters []struct {
			Status *api.ClusterStatus `json:"status"`
		} `json:"masters"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("carve cluster status --json: %v\n%s", err, out)
	}
	for _, v := range rep.Masters {
		if v.Status == nil || voterSetOf(v.Status.Servers) != "m1,m2,m3" {
			t.Errorf("a master's voters are not m1,m2,m3 after m3 joined again: %+v", v.Status)
		}
	}
	pingAll(ctx, t, cs)
}

// TestTroubleshootingMasterBehind: m3's data dir is a small tmpfs, filled
// once the cluster runs; writes go on. The section's commands show m3
// unable to write and behind (the two problem lines the section quotes),
// its disk full and its log saying no space left on device; freeing the
// disk (the fix) lets it catch up, and the status is healthy.
func TestTroubleshootingMasterBehind(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A master behind")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	m3 := c.Masters()[2]
	disk := testutil.SmallDisk(t, m3.DataDir, "16m")
	ctx := within(t, 6*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	filler := disk.Fill(t)
	// Both problem lines of the section: the probe's, and the lag once
	// the cluster committed enough more.
	driveUntil(ctx, t, c, c.Masters()[:2], "carve cluster status reports m3 unable to write and behind",
		problems("master m3 ("+m3.URL()+"): cannot write its --data-dir", "entries behind"))

	cmds := codeLines(sec.Commands)
	requireCommand(t, cmds, "carve cluster status $OP")
	requireCommand(t, cmds, "df -h /var/lib/carve-master")
	requireCommand(t, cmds, "journalctl -u carve-master")
	res := o.runAll(ctx, t, m3.Host, cmds, map[string]string{"/var/lib/carve-master": m3.DataDir})
	st := startingWith(t, res, "carve cluster status")
	if st.exited != 1 || !problemNaming(st.out, "master m3 (") || !strings.Contains(st.out, "entries behind") {
		t.Errorf("carve cluster status (exit %d) does not report m3 behind as the section says:\n%s", st.exited, st.out)
	}
	quoted := inlineCommands(sec.Symptom, "master ")
	if len(quoted) != 2 {
		t.Fatalf("the section's symptom quotes %d problem lines, want 2 (unable to write, behind): %q", len(quoted), quoted)
	}
	for _, q := range quoted {
		// N, A and C stand for numbers.
		ex := regexp.MustCompile(`\b[NAC]\b`).ReplaceAllLiteralString(q, "0")
		if !matchesProblem(regexp.MustCompile(`[0-9]+`).ReplaceAllLiteralString(st.out, "0"), ex) {
			t.Errorf("the section quotes the problem %q, which carve cluster status does not print:\n%s", q, st.out)
		}
	}
	if out := startingWith(t, res, "df -h").out; !strings.Contains(out, "100%") {
		t.Errorf("df does not show m3's disk full:\n%s", out)
	}
	if out := startingWith(t, res, "journalctl -u carve-master").out; !strings.Contains(out, "no space left on device") {
		t.Errorf("m3's log does not say no space left on device, as the section says:\n%s", out)
	}
	if !strings.Contains(sec.Fixes, "Free or grow its disk") {
		t.Fatalf("the section's fix no longer frees the disk:\n%s", sec.Fixes)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitHealthy(ctx, t, c)
}

// TestTroubleshootingTLSError: host 3's agent restarts with another
// cluster's ca.pem. The section's commands show why: its log names the
// master's certificate that does not verify against --ca-file, and openssl
// finds the agent's own certificate issued by another CA than the file it
// was given; with the cluster's ca.pem again (the fix for another CA) it
// follows the masters and its containers ping.
func TestTroubleshootingTLSError(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A TLS error")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cs)
	h3 := c.Host(3)
	other := t.TempDir()
	if err := pki.CreateCA(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(other, pki.CAFile)
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h3, "--ca-file", otherCA); err != nil {
		t.Fatal(err)
	}

	cmds := codeLines(sec.Commands)
	grep := startingWithLine(t, cmds, "journalctl -u carve-agent")
	requireCommand(t, cmds, "openssl verify -CAfile /etc/carve/pki/ca.pem /etc/carve/pki/h1.pem")
	files := map[string]string{"/etc/carve/pki/ca.pem": otherCA, "/etc/carve/pki/h1.pem": c.AgentFiles(h3).Cert}
	testutil.Eventually(t, converge, "host 3's agent logs why the masters are refused", func() error {
		r, _ := o.run(ctx, t, h3, grep, files)
		if !strings.Contains(r.out, "does not verify against --ca-file") {
			return fmt.Errorf("%s: not the cause the section names:\n%s", grep, r.out)
		}
		return nil
	})
	res := o.runAll(ctx, t, h3, cmds, files)
	if r := startingWith(t, res, "openssl x509"); r.exited != 0 || !strings.Contains(r.out, "issuer") {
		t.Errorf("openssl x509 on the agent's certificate (exit %d):\n%s%s", r.exited, r.out, r.stderr)
	}
	if r := startingWith(t, res, "openssl verify"); r.exited == 0 {
		t.Errorf("openssl verify passes the agent's certificate against the other CA:\n%s%s", r.out, r.stderr)
	}

	if !strings.Contains(sec.Fixes, "Another CA: every certificate must come from the one `ca.pem`") {
		t.Fatalf("the section no longer fixes another CA by the cluster's one ca.pem:\n%s", sec.Fixes)
	}
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h3); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := o.run(ctx, t, h3, startingWithLine(t, cmds, "openssl verify"), map[string]string{"/etc/carve/pki/ca.pem": c.OperatorFiles().CA, "/etc/carve/pki/h1.pem": c.AgentFiles(h3).Cert}); r.exited != 0 {
		t.Errorf("openssl verify against the cluster's ca.pem (exit %d):\n%s%s", r.exited, r.out, r.stderr)
	}
	waitPings(ctx, t, cs)
}

// TestTroubleshootingLeak: an allocation through host 2's IPAM socket for
// a container no runtime attached (the guide's example container id) is a
// leak. The section's commands list it; its fix, carve ipam release on
// host 2 (with the lab agent's socket), frees it and the check is clean.
func TestTroubleshootingLeak(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "A leak")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	h2 := c.Host(2)
	fixes := codeLines(sec.Fixes)
	byID := startingWithLine(t, fixes, "carve ipam release --container-id ")
	id := strings.Fields(byID)[4]
	leak, err := c.IPAMClient(h2).Allocate(ctx, api.IPAMRequest{Network: "carve", ContainerID: id, IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	leakAddr, _, _ := strings.Cut(leak.IPs[0].Address, "/")

	cmds := codeLines(sec.Commands)
	check := startingWithLine(t, cmds, "carve ipam check $OP")
	testutil.Eventually(t, converge, "carve ipam check lists the leak", func() error {
		r, _ := o.run(ctx, t, c.Host(1), check, nil)
		if r.exited != 1 || !strings.Contains(r.out, leakAddr) || !strings.Contains(r.out, id) {
			return fmt.Errorf("%s (exit %d) does not list the leak of %s by %s, exit 1:\n%s", check, r.exited, leakAddr, id, r.out)
		}
		return nil
	})
	o.runAll(ctx, t, c.Host(1), cmds, nil)

	// The lab's agent listens on its own socket, not /run/carve/agent.sock.
	socket := " --socket " + h2.SocketPath()
	r, _ := o.run(ctx, t, h2, byID+socket, nil)
	if r.exited != 0 || !strings.Contains(r.out, leakAddr) {
		t.Fatalf("%s (exit %d) did not say it released %s:\n%s%s", byID, r.exited, leakAddr, r.out, r.stderr)
	}
	byIP := startingWithLine(t, fixes, "carve ipam release --ip ")
	if r, _ := o.run(ctx, t, h2, byIP+socket, map[string]string{"10.128.3.7": leakAddr}); r.exited == 0 || !strings.Contains(r.stderr, "no such attachment") {
		t.Errorf("%s, released already (exit %d): the section says it prints no such attachment:\n%s%s", byIP, r.exited, r.out, r.stderr)
	}
	testutil.Eventually(t, converge, "carve ipam check is clean", func() error {
		r, _ := o.run(ctx, t, c.Host(1), check, nil)
		if r.exited != 0 {
			return fmt.Errorf("%s (exit %d):\n%s", check, r.exited, r.out)
		}
		return nil
	})
	waitPings(ctx, t, cs)
}

// TestTroubleshootingAgentNotRegistered: host 4's agent starts with an
// agent id its certificate does not name (CARVE_ID set by mistake). It
// exits at start; the section's commands show it missing from the masters'
// state and its log names the cause as the section quotes it; started
// again without the id (the fix: leave CARVE_ID empty), it registers and
// its container pings the others.
func TestTroubleshootingAgentNotRegistered(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	sec := readGuide(t).section(t, "An agent that does not register")
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 4, Masters: 3, Prefix: prefix})
	o := newOperator(t, c, readGuide(t))
	ctx := within(t, 4*converge)
	if err := c.StartMasters(ctx); err != nil {
		t.Fatal(err)
	}
	hs := c.Hosts()
	for _, h := range hs[:3] {
		if err := c.StartAgent(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	h4 := hs[3]
	const wrongID = "h4-typo"
	if err := c.StartAgent(h4, "--id", wrongID); err != nil {
		t.Fatal(err)
	}
	cmds := codeLines(sec.Commands)
	logLine := startingWithLine(t, cmds, "journalctl -u carve-agent")
	testutil.Eventually(t, converge, "host 4's agent logs why it is not registered", func() error {
		r, _ := o.run(ctx, t, h4, logLine, nil)
		if want := `--id "` + wrongID + `" differs from the agent id "` + h4.CertName() + `" that --cert-file`; !strings.Contains(r.out, want) {
			return fmt.Errorf("%s: no line saying %s:\n%s", logLine, want, r.out)
		}
		return nil
	})
	if !strings.Contains(strings.Join(strings.Fields(sec.Fixes), " "), "`--id \"h2\" differs from the agent id \"h1\" that --cert-file ... names`") {
		t.Errorf("the section does not quote the agent's message for a CARVE_ID its certificate does not name:\n%s", sec.Fixes)
	}
	res := o.runAll(ctx, t, h4, cmds, nil)
	state := startingWith(t, res, "carve state $OP")
	if state.exited != 0 || strings.Contains(state.out, wrongID) || strings.Contains(state.out, h4.CertName()) {
		t.Errorf("carve state (exit %d) lists host 4's agent, which did not register:\n%s", state.exited, state.out)
	}
	if !strings.Contains(strings.Join(strings.Fields(sec.Fixes), " "), "leave `CARVE_ID` empty") {
		t.Fatalf("the section no longer fixes a wrong CARVE_ID by leaving it empty:\n%s", sec.Fixes)
	}
	if err := c.StopAgent(ctx, h4); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h4); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := o.run(ctx, t, h4, startingWithLine(t, cmds, "carve state $OP"), nil); !strings.Contains(r.out, h4.CertName()) {
		t.Errorf("carve state does not list host 4's agent %s once it registered:\n%s", h4.CertName(), r.out)
	}
	waitPings(ctx, t, containerPerHost(ctx, t, c))
}
