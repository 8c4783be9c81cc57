// Package deploy holds the files an installation uses (systemd units,
// example configurations, install scripts); its tests check that they are
// valid and agree with the carve binary, and that the documentation
// (README.md, docs/) names every flag of every command and only flags that
// exist.
package deploy

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/testutil"
)

// installedBinary is the path the units run carve from.
const installedBinary = "/usr/local/bin/carve"

// units maps each unit to the carve command it runs and its example env file.
// caps is the unit's only capabilities; exposure the most that
// systemd-analyze security may rate it (0-100, ten times its score), so that
// dropping a hardening option fails the test.
var units = []struct {
	file, command, env string
	caps               string
	exposure           int
}{
	{"carve-master.service", "master", "examples/master.env", "", 15},
	{"carve-agent.service", "agent", "examples/agent.env", "CAP_NET_ADMIN CAP_NET_RAW CAP_CHOWN CAP_BPF", 30},
}

// buildCarve builds cmd/carve into a temporary directory.
func buildCarve(t *testing.T) string {
	t.Helper()
	return filepath.Join(buildBinaries(t, "carve"), "carve")
}

// hardening are settings every unit keeps.
var hardening = []string{
	"Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
	"PrivateTmp=yes", "PrivateDevices=yes", "SystemCallFilter=@system-service", "SystemCallArchitectures=native",
	"RestrictNamespaces=yes", "RestrictSUIDSGID=yes", "LockPersonality=yes", "MemoryDenyWriteExecute=yes",
}

// checkUnit checks unit text with ExecStart pointing at bin and returns its
// problems: what systemd-analyze verify says (a non-zero exit or any output:
// systemd only warns about unknown keys and bad values, and exits 0), an
// exposure above the limit by systemd-analyze security, and capabilities
// other than caps (systemd ignores unknown capability names), and a
// missing hardening setting.
func checkUnit(t *testing.T, analyze, name, text, bin, caps string, exposure int) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, installedBinary, bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	var problems []string
	run := func(args ...string) (string, error) {
		cmd := exec.Command(analyze, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	switch out, err := run("verify", "--man=no", path); {
	case err != nil:
		problems = append(problems, fmt.Sprintf("systemd-analyze verify: %v\n%s", err, out))
	case out != "":
		problems = append(problems, "systemd-analyze verify:\n"+out)
	}
	if out, err := run("security", "--offline=yes", "--threshold="+strconv.Itoa(exposure), path); err != nil {
		lines := strings.Split(out, "\n")
		problems = append(problems, fmt.Sprintf("systemd-analyze security: %v (limit %d.%d): %s", err, exposure/10, exposure%10, lines[len(lines)-1]))
	}
	for _, line := range hardening {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(line) + `$`).MatchString(text) {
			problems = append(problems, name+": missing "+line)
		}
	}
	for _, key := range []string{"CapabilityBoundingSet", "AmbientCapabilities"} {
		m := regexp.MustCompile(`(?m)^`+key+`=(.*)$`).FindAllStringSubmatch(text, -1)
		if len(m) != 1 || strings.Join(strings.Fields(m[0][1]), " ") != caps {
			problems = append(problems, fmt.Sprintf("%s: want exactly one line %s=%s, got %q", name, key, caps, m))
		}
	}
	return strings.Join(problems, "\n")
}

func readUnit(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("systemd", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	testutil.Require(t, err == nil, "systemd-analyze is not installed (Debian package systemd): the units are not verified")
	bin := buildCarve(t)
	for _, u := range units {
		t.Run(u.file, func(t *testing.T) {
			text := readUnit(t, u.file)
			if got := execStart(t, text); !slices.Equal(got, []string{installedBinary, u.command}) {
				t.Fatalf("ExecStart is %q, want %s %s (the flags come from the env file)", got, installedBinary, u.command)
			}
			if problems := checkUnit(t, analyze, u.file, text, bin, u.caps, u.exposure); problems != "" {
				t.Fatalf("%s:\n%s", u.file, problems)
			}
		})
	}
}

// TestUnitsVerifyCatchesBrokenUnits makes sure the verification above can
// fail: each breakage of a real unit must draw a complaint.
func TestUnitsVerifyCatchesBrokenUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	testutil.Require(t, err == nil, "systemd-analyze is not installed (Debian package systemd): the units are not verified")
	bin := buildCarve(t)
	agent := units[1]
	text := readUnit(t, agent.file)
	for _, tc := range []struct{ name, old, new string }{
		{"missing binary", installedBinary + " agent", installedBinary + "-missing agent"},
		{"bad restart policy", "Restart=on-failure", "Restart=sometimes"},
		{"misspelt key", "NoNewPrivileges=yes", "NoNewPrivilege=yes"},
		{"bad service type", "Type=exec", "Type=execute"},
		{"unknown capability", "CAP_NET_RAW CAP_CHOWN CAP_BPF\nAmbient", "CAP_NET_RAWW CAP_CHOWN CAP_BPF\nAmbient"},
		{"one capability more", "CapabilityBoundingSet=CAP_NET_ADMIN", "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_NET_ADMIN"},
		{"no system call filter", "SystemCallFilter=@system-service\n", ""},
		{"file system writable", "ProtectSystem=strict\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(text, tc.old) {
				t.Fatalf("the unit no longer contains %q: update the test", tc.old)
			}
			broken := strings.Replace(text, tc.old, tc.new, 1)
			problems := checkUnit(t, analyze, agent.file, broken, bin, agent.caps, agent.exposure)
			if problems == "" {
				t.Fatalf("the check accepted the unit with %s", tc.name)
			}
			t.Logf("refused: %s", problems)
		})
	}
}

var envLine = regexp.MustCompile(`^([A-Z0-9_]+)=(.*)$`)

// flagsWithoutExample are the flags whose variable the examples leave out:
// --check-config has none, and --insecure is for a throwaway lab only.
var flagsWithoutExample = []string{"check-config", "insecure"}

// TestUnitsMatchBinaryAndEnv checks that each example env file defines
// exactly the variables of the command's flags (CARVE_X_Y for --x-y; a
// misspelt one would be ignored), every one but flagsWithoutExample, and
// that docs/configuration.md names, beside each flag of the command, its
// variable (none for --check-config).
func TestUnitsMatchBinaryAndEnv(t *testing.T) {
	dir := buildBinaries(t, "carve")
	for _, u := range units {
		t.Run(u.file, func(t *testing.T) {
			command := "carve " + u.command
			flags := commandFlags(t, dir, command)
			variables := map[string]string{}
			for f := range flags {
				if f != "check-config" {
					variables[cli.EnvName(f)] = f
				}
			}
			defined := readEnv(t, u.env)
			for v := range defined {
				if _, ok := variables[v]; !ok {
					t.Errorf("%s defines %s, which is no variable of %s (the flags: %s -h)", u.env, v, command, command)
				}
			}
			for v, f := range variables {
				if _, ok := defined[v]; !ok && !slices.Contains(flagsWithoutExample, f) {
					t.Errorf("%s does not define %s, the variable of --%s", u.env, v, f)
				}
			}
			documented := readDocumentedFlags(t, command)
			for _, row := range documented[command] {
				var want []string
				for _, f := range row.flags {
					if f != "check-config" {
						want = append(want, "`"+cli.EnvName(f)+"`")
					}
				}
				if len(row.cells) < 3 || row.cells[1] != strings.Join(want, ", ") {
					t.Errorf("%s: the row of %s names %q as its %s variables, want %q", configurationDoc, row.cells[0], row.cells[1:min(2, len(row.cells))], filepath.Base(u.env), strings.Join(want, ", "))
				}
			}
			t.Logf("%s: %s", u.env, strings.Join(slices.Sorted(maps.Keys(defined)), " "))
		})
	}
}

// readDocumentedFlags reads the flag tables of docs/configuration.md for
// command (TestDocsNameEveryFlag checks that they list exactly its flags).
func readDocumentedFlags(t *testing.T, command string) map[string][]docRow {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, configurationDoc))
	if err != nil {
		t.Fatal(err)
	}
	documented, _ := documentedFlags(string(data), []string{command})
	if len(documented[command]) == 0 {
		t.Fatalf("%s has no flag table for %s", configurationDoc, command)
	}
	return documented
}

// readEnv reads an EnvironmentFile's assignments.
func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := envLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%s:%d: %q is not VAR=value", path, n, line)
		}
		if _, dup := out[m[1]]; dup {
			t.Fatalf("%s:%d: %s defined twice", path, n, m[1])
		}
		out[m[1]] = m[2]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExampleNetworkConfigs loads every example network configuration as
// carve master --config does.
func TestExampleNetworkConfigs(t *testing.T) {
	files, err := filepath.Glob("examples/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples/*.json")
	}
	for _, f := range files {
		if _, err := netconfig.Load(f); err != nil {
			t.Errorf("carve master --config %s: %v", f, err)
		}
	}
	def, err := netconfig.Load("examples/network.json")
	if err != nil {
		t.Fatal(err)
	}
	if want := netconfig.Default(); !reflect.DeepEqual(withoutEnabled(def), withoutEnabled(want)) {
		t.Errorf("examples/network.json is not the default configuration:\n got %+v\nwant %+v", def, want)
	}
}

// withoutEnabled drops the overlays' explicit "enabled": true (absent means
// enabled), so that a file that writes it equals the defaults.
func withoutEnabled(cfg api.NetworkConfig) api.NetworkConfig {
	cfg.Overlays = slices.Clone(cfg.Overlays)
	for i := range cfg.Overlays {
		if cfg.Overlays[i].IsEnabled() {
			cfg.Overlays[i].Enabled = nil
		}
	}
	return cfg
}

// TestExampleDockerNetworkName: the example names the Docker networks as
// docs/configuration.md documents and as the binary defaults to (the
// overlay's name, as DC/OS), and that variable is the one of
// --docker-network-name; the Mesos CNI isolator's directory is set the
// same way, off in the example as by default.
func TestExampleDockerNetworkName(t *testing.T) {
	env := readEnv(t, "examples/agent.env")
	const command = "carve agent"
	flags := commandFlags(t, buildBinaries(t, "carve"), command)
	documented := readDocumentedFlags(t, command)
	for _, f := range []struct{ flag, variable, want string }{
		{"docker-network-name", "CARVE_DOCKER_NETWORK_NAME", "{overlay}"},
		{"mesos-cni-conf-dir", "CARVE_MESOS_CNI_CONF_DIR", ""},
	} {
		row, ok := rowFor(documented, command, f.flag)
		if !ok {
			t.Errorf("%s documents no --%s of %s", configurationDoc, f.flag, command)
			continue
		}
		meaning := row.cells[len(row.cells)-1]
		var documentedDefault string
		if m := regexp.MustCompile("default `([^`]*)`").FindStringSubmatch(meaning); m != nil {
			documentedDefault = m[1]
		} else if !strings.Contains(meaning, "default empty") {
			t.Errorf("%s: the row of --%s names no default: %s", configurationDoc, f.flag, meaning)
		}
		if got, ok := env[f.variable]; !ok || got != f.want || documentedDefault != f.want {
			t.Errorf("--%s: examples/agent.env sets %s=%q, %s documents %q; want both %q", f.flag, f.variable, got, configurationDoc, documentedDefault, f.want)
		}
		if cli.EnvName(f.flag) != f.variable {
			t.Errorf("--%s has the variable %s, not %s", f.flag, cli.EnvName(f.flag), f.variable)
		}
		// Go's flag package prints a non-empty default as (default "...").
		wantHelp := fmt.Sprintf("(default %q)", f.want)
		if help := flags[f.flag]; f.want != "" && !strings.Contains(help, wantHelp) || f.want == "" && strings.Contains(help, "(default ") {
			t.Errorf("carve agent -h for --%s: %q, want the default %q", f.flag, help, f.want)
		}
	}
}
