package deploy

import (
	"bufio"
	"errors"
	stdmaps "maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/pkitest"
)

// execStart returns the words of a unit's ExecStart (continued lines
// joined).
func execStart(t *testing.T, unit string) []string {
	t.Helper()
	var line string
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		text := sc.Text()
		if line == "" && !strings.HasPrefix(text, "ExecStart=") {
			continue
		}
		line += strings.TrimSuffix(text, "\\") + " "
		if !strings.HasSuffix(text, "\\") {
			break
		}
	}
	if line == "" {
		t.Fatal("the unit has no ExecStart=")
	}
	return strings.Fields(strings.TrimPrefix(line, "ExecStart="))
}

// installedEnv is an example env file with its installed paths pointed at
// files of the test: the certificates of a throwaway CA (m1 and h1, as the
// examples name them), the example network.json, a mesh password and an
// empty data directory.
func installedEnv(t *testing.T, file string) map[string]string {
	t.Helper()
	env := readEnv(t, file)
	ca := pkitest.New(t)
	ca.Files("m1", pki.RoleMaster)
	// As an operator issues it: for the underlay IP the agent registers
	// (carve agent --check-config refuses an --ip its certificate lacks).
	if ip, err := netip.ParseAddr(env["CARVE_IP"]); err == nil {
		ca.IssueAgent("h1", ip)
	}
	ca.Files("h1", pki.RoleAgent)
	password := filepath.Join(t.TempDir(), "mesh-password")
	if err := os.WriteFile(password, []byte("a mesh password of the test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	network, err := filepath.Abs("examples/network.json")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range env {
		switch {
		case k == "CARVE_DATA_DIR":
			env[k] = t.TempDir()
		case v == "/etc/carve/network.json":
			env[k] = network
		case v == "/etc/carve/mesh-password":
			env[k] = password
		case strings.HasPrefix(v, "/etc/carve/pki/"):
			env[k] = filepath.Join(ca.Dir, strings.TrimPrefix(v, "/etc/carve/pki/"))
		}
	}
	return env
}

// checkConfig runs the unit's ExecStart, its binary replaced by bin, with
// --check-config and nothing but env in its environment, as systemd runs
// it with the env file; it returns stdout, stderr and the exit code.
func checkConfig(t *testing.T, bin string, argv []string, env map[string]string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, append(argv[1:], "--check-config")...)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode()
	default:
		t.Fatal(err)
		return "", "", -1
	}
}

// fromRow is the FROM column --check-config prints for a flag.
func fromRow(out, flag string) (value, from string, ok bool) {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "--"+flag {
			return f[1], f[2], true
		}
	}
	return "", "", false
}

// TestUnitsStartWithExampleEnv drives each unit's ExecStart with its
// example env file: it starts (--check-config: every flag, variable and
// file checked, nothing started) and takes each flag from its variable;
// emptied, a variable means the flag's default, or the refusal names it;
// a bad value is refused naming the variable.
func TestUnitsStartWithExampleEnv(t *testing.T) {
	bin := buildCarve(t)
	// mayNotBeEmpty are, per command, the variables whose flags have no
	// usable default.
	tlsVars := []string{"CARVE_DATA_DIR", "CARVE_CA_FILE", "CARVE_CERT_FILE", "CARVE_KEY_FILE"}
	mayNotBeEmptyOf := map[string][]string{
		// The addresses' loopback defaults are no use beside peers on
		// other hosts (issue 27, item 7): refused, naming the variable.
		"master": append([]string{"CARVE_ID", "CARVE_PEERS", "CARVE_SIGNING_KEY_FILE", "CARVE_RAFT_ADDR", "CARVE_HTTP_ADDR"}, tlsVars...),
		"agent":  append([]string{"CARVE_MASTERS", "CARVE_MESH_PASSWORD_FILE"}, tlsVars...),
	}
	for _, u := range units {
		mayNotBeEmpty := mayNotBeEmptyOf[u.command]
		t.Run(u.file, func(t *testing.T) {
			argv := execStart(t, readUnit(t, u.file))
			env := installedEnv(t, u.env)
			out, errOut, code := checkConfig(t, bin, argv, env)
			if code != 0 {
				t.Fatalf("%s with %s: exit %d\n%s%s", u.file, u.env, code, out, errOut)
			}
			for k, v := range env {
				flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, cli.EnvPrefix), "_", "-"))
				if _, from, ok := fromRow(out, flag); v != "" && (!ok || from != k) {
					t.Errorf("--%s: from %q, want %s\n%s", flag, from, k, out)
				}
			}
			for _, k := range slices.Sorted(stdmaps.Keys(env)) {
				t.Run(k+"=", func(t *testing.T) {
					emptied := stdmaps.Clone(env)
					emptied[k] = ""
					out, errOut, code := checkConfig(t, bin, argv, emptied)
					switch {
					case code == 0 && slices.Contains(mayNotBeEmpty, k):
						t.Errorf("accepted with %s empty:\n%s", k, out)
					case code == 0:
						flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, cli.EnvPrefix), "_", "-"))
						if _, from, _ := fromRow(out, flag); from != "default" {
							t.Errorf("%s empty: --%s from %q, want its default", k, flag, from)
						}
					case !slices.Contains(mayNotBeEmpty, k) || !strings.Contains(errOut, k):
						t.Errorf("%s empty: exit %d, want the default or an error naming %s:\n%s", k, code, k, errOut)
					default:
						t.Logf("refused: %s", strings.TrimSpace(errOut))
					}
				})
			}
		})
	}
}

// TestEnvErrorsNameTheVariable: the values of issue 20's finding 5. An
// empty value means the default (the socket too: an agent never runs
// without its IPAM socket); a bad one is refused naming its variable.
func TestEnvErrorsNameTheVariable(t *testing.T) {
	bin := buildCarve(t)
	agent := units[1]
	argv := execStart(t, readUnit(t, agent.file))
	for _, tc := range []struct {
		variable, value string
		wantValue       string // printed by --check-config, when it passes
		wantErr         string // in stderr, when it is refused
	}{
		{"CARVE_RESYNC_INTERVAL", "", `"30s"`, ""},
		{"CARVE_MESOS_BRIDGE", "", `"true"`, ""},
		{"CARVE_LOG_LEVEL", "", `"info"`, ""},
		{"CARVE_SOCKET_GROUP", "", `"0"`, ""},
		{"CARVE_HTTP_ADDR", "", `"127.0.0.1:9797"`, ""},
		{"CARVE_SOCKET", "", `"/run/carve/agent.sock"`, ""},
		{"CARVE_RESYNC_INTERVAL", "soon", "", `CARVE_RESYNC_INTERVAL: invalid duration (like 30s or 5m) "soon"`},
		{"CARVE_RESYNC_INTERVAL", "10ms", "", "--resync-interval 10ms: at least 1s (set by CARVE_RESYNC_INTERVAL)"},
		{"CARVE_MESOS_BRIDGE", "yes please", "", `CARVE_MESOS_BRIDGE: invalid boolean (true or false) "yes please"`},
		{"CARVE_MESH_PEERS", "many", "", `CARVE_MESH_PEERS: invalid integer "many"`},
		{"CARVE_LOG_LEVEL", "loud", "", "(set by CARVE_LOG_LEVEL)"},
	} {
		t.Run(tc.variable+"="+tc.value, func(t *testing.T) {
			env := installedEnv(t, agent.env)
			env[tc.variable] = tc.value
			out, errOut, code := checkConfig(t, bin, argv, env)
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(tc.variable, cli.EnvPrefix), "_", "-"))
			if tc.wantErr != "" {
				if code != 2 || !strings.Contains(errOut, tc.wantErr) {
					t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut, tc.wantErr)
				}
				return
			}
			if value, _, _ := fromRow(out, flag); code != 0 || value != tc.wantValue {
				t.Errorf("exit %d, --%s %s; want 0 and %s\n%s", code, flag, value, tc.wantValue, errOut)
			}
		})
	}
}
