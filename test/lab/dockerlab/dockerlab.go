// Package dockerlab runs a real Docker engine (dockerd and its containerd)
// inside a lab host's network namespace, for the Docker plugin's test, the
// end-to-end tests and the demo, and talks to it over its unix socket.
//
// Containment: dockerd runs in the host's network namespace (its bridges and
// routes stay there; it runs with --iptables=false, so it adds no firewall
// rules), in a private mount namespace with that network namespace's own
// /sys and a tmpfs over /run and /etc/docker, and with its own data, exec
// and containerd state directories under Options.Dir; its cgroups live
// under a parent of its own. Docker discovers IPAM plugins in
// /run/docker/plugins, which is Options.PluginDir bind-mounted there (the
// machine's own directory is never used). Stop ends only the processes it
// started, by PID, and what they left in the namespace.
package dockerlab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// ErrCannotRun is wrapped by Start when dockerd cannot run on this machine
// (no cgroups, a kernel or sandbox that refuses it): callers skip, or say
// so and go on, rather than fail.
var ErrCannotRun = errors.New("dockerd cannot run here")

// Image is the image ImportBusybox imports: a root file system holding a
// static busybox, as no registry is reachable from a lab.
const Image = "carve-busybox:lab"

// Binaries finds the programs an engine needs (Debian's docker.io).
func Binaries() (map[string]string, error) {
	return enginelab.LookPaths("docker.io", "dockerd", "containerd", "containerd-shim-runc-v2", "runc", "mount", "umount")
}

// Options configure Start.
type Options struct {
	// Dir holds the engine's sockets, state and logs (required, short:
	// unix socket paths are limited to 108 bytes). Stop removes it.
	Dir string
	// PluginDir, when set, is what dockerd sees as /run/docker/plugins,
	// where it discovers IPAM plugins by their socket.
	PluginDir string
	// CgroupParent is the cgroup of the containers (default
	// carve-lab-<pid>-<base of Dir>); Stop removes it.
	CgroupParent string
	// Bins are the programs (default Binaries()).
	Bins map[string]string
	// StartTimeout bounds the wait for the engine to answer (default 90s).
	StartTimeout time.Duration
}

// Engine is a dockerd this package started.
type Engine struct {
	opts   Options
	host   *netnslab.Host
	sock   string
	cmd    *exec.Cmd
	waited chan error
	http   *http.Client
}

// Start starts containerd and dockerd inside host's network namespace and
// waits until the engine answers. When the daemon cannot start here, the
// error wraps ErrCannotRun and quotes dockerd's own words; what was started
// is stopped again.
func Start(ctx context.Context, host *netnslab.Host, opts Options) (*Engine, error) {
	if opts.Dir == "" {
		return nil, errors.New("dockerlab: no Options.Dir")
	}
	if opts.Bins == nil {
		bins, err := Binaries()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCannotRun, err)
		}
		opts.Bins = bins
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = fmt.Sprintf("carve-lab-%d-%s", os.Getpid(), filepath.Base(opts.Dir))
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 90 * time.Second
	}
	e := &Engine{opts: opts, host: host, sock: filepath.Join(opts.Dir, "docker.sock"), waited: make(chan error, 1)}
	e.http = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", e.sock)
	}}}
	for _, sub := range []string{"data", "exec", "containerd", "cg"} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, sub), 0o711); err != nil {
			return nil, fmt.Errorf("dockerlab: %w", err)
		}
	}
	ctd := filepath.Join(opts.Dir, "containerd")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
`, filepath.Join(ctd, "root"), filepath.Join(ctd, "state"), filepath.Join(ctd, "c.sock"), filepath.Join(ctd, "c.sock.ttrpc"))
	if err := os.WriteFile(filepath.Join(opts.Dir, "containerd.toml"), []byte(config), 0o644); err != nil {
		return nil, fmt.Errorf("dockerlab: %w", err)
	}
	plugins := ""
	if opts.PluginDir != "" {
		plugins = fmt.Sprintf("mount --bind %q /run/docker/plugins\n", opts.PluginDir)
	}
	// Inside a private mount namespace (Unshareflags below):
	// enginelab.PrivateMounts (the network namespace's own /sys, a tmpfs
	// over /run), and a tmpfs over /etc/docker, which dockerd writes to
	// regardless of its flags.
	script := fmt.Sprintf(`set -e
%smkdir -p /run/docker/plugins /run/containerd
%sif [ -d /etc/docker ]; then mount -t tmpfs -o mode=0755 carve-lab /etc/docker; fi
%q --config "$D/containerd.toml" >"$D/containerd.log" 2>&1 &
echo $! >"$D/containerd.pid"
exec %q --data-root "$D/data" --exec-root "$D/exec" --pidfile "$D/dockerd.pid" \
  --host "unix://$D/docker.sock" --containerd "$D/containerd/c.sock" \
  --bridge=none --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
  --storage-driver=vfs --cgroup-parent=/%s >"$D/dockerd.log" 2>&1
`, enginelab.PrivateMounts(opts.Dir), plugins, opts.Bins["containerd"], opts.Bins["dockerd"], opts.CgroupParent)
	if err := os.WriteFile(filepath.Join(opts.Dir, "run.sh"), []byte(script), 0o644); err != nil {
		return nil, fmt.Errorf("dockerlab: %w", err)
	}
	e.cmd = exec.Command("/bin/sh", filepath.Join(opts.Dir, "run.sh"))
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	e.cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(opts.Bins["runc"])+":"+filepath.Dir(opts.Bins["containerd-shim-runc-v2"])+":/usr/sbin:/usr/bin:/sbin:/bin")
	if err := host.Start(e.cmd); err != nil {
		return nil, fmt.Errorf("dockerlab: start dockerd: %w", err)
	}
	go func() { e.waited <- e.cmd.Wait() }()

	wctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	err := retry.Until(wctx, 100*time.Millisecond, func() error {
		select {
		case err := <-e.waited:
			e.waited <- err
			return retry.Permanent(fmt.Errorf("it exited (%v)", err))
		default:
		}
		pctx, pcancel := context.WithTimeout(wctx, 2*time.Second)
		defer pcancel()
		return e.Call(pctx, http.MethodGet, "/_ping", nil, nil)
	})
	if err != nil {
		why := enginelab.DaemonError(filepath.Join(opts.Dir, "dockerd.log"))
		_ = e.Stop()
		return nil, fmt.Errorf("%w: %v: %s", ErrCannotRun, err, why)
	}
	return e, nil
}

// Host is the engine's address as Docker clients name it (unix:///...).
func (e *Engine) Host() string { return "unix://" + e.sock }

// Dir is the engine's directory (its logs: dockerd.log, containerd.log).
func (e *Engine) Dir() string { return e.opts.Dir }

// Stop removes the containers, stops dockerd and containerd by PID (SIGTERM,
// SIGKILL after 30s), kills what they left in the namespace (shims and their
// children, by PID), and removes the cgroups and the directory. It returns
// what it could not undo.
func (e *Engine) Stop() error {
	var errs []error
	var ids []struct {
		ID string `json:"Id"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if e.Call(ctx, http.MethodGet, "/containers/json?all=1", nil, &ids) == nil {
		for _, c := range ids {
			_ = e.Call(ctx, http.MethodDelete, "/containers/"+c.ID+"?force=1", nil, nil)
		}
	}
	ctdPID := enginelab.ReadPID(filepath.Join(e.opts.Dir, "containerd.pid"))
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.waited:
	case <-time.After(30 * time.Second):
		errs = append(errs, fmt.Errorf("dockerd (pid %d) ignored SIGTERM for 30s; killed it", e.cmd.Process.Pid))
		_ = e.cmd.Process.Kill()
		<-e.waited
	}
	if ctdPID > 0 && netnslab.PIDAlive(ctdPID) {
		_ = syscall.Kill(ctdPID, syscall.SIGTERM)
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := retry.Until(wctx, 100*time.Millisecond, func() error {
			if netnslab.PIDAlive(ctdPID) {
				return errors.New("still running")
			}
			return nil
		})
		wcancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("containerd (pid %d) ignored SIGTERM for 30s; killed it", ctdPID))
			_ = syscall.Kill(ctdPID, syscall.SIGKILL)
		}
	}
	// Every process in the host's namespace and below: the daemons started
	// all of them.
	if want, err := enginelab.NetNSLink(e.host); err != nil {
		errs = append(errs, err)
	} else {
		for _, pid := range enginelab.ProcessesIn("net", want) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// The daemons' mounts lived in their own mount namespace, gone with
	// them: nothing under the directory is mounted here.
	if err := enginelab.RemoveLeftovers(e.opts.CgroupParent, e.opts.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// LogTail returns the end of dockerd's and containerd's logs (for a failure).
func (e *Engine) LogTail(max int) string {
	var b strings.Builder
	for _, l := range []string{"dockerd.log", "containerd.log"} {
		data, _ := os.ReadFile(filepath.Join(e.opts.Dir, l))
		if len(data) > max {
			data = data[len(data)-max:]
		}
		fmt.Fprintf(&b, "%s (tail):\n%s\n", l, data)
	}
	return b.String()
}

// Call makes an engine API call (unversioned); a non-2xx answer is an error
// carrying the engine's message. A nil out discards the answer.
func (e *Engine) Call(ctx context.Context, method, path string, in io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, in)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		var m struct{ Message string }
		if json.Unmarshal(data, &m) == nil && m.Message != "" {
			return errors.New(m.Message)
		}
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

// CallJSON is Call with in encoded as JSON.
func (e *Engine) CallJSON(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	return e.Call(ctx, method, path, body, out)
}

// ImportBusybox imports Image: a root file system holding only busybox and
// its applets (enginelab.BusyboxRootfs).
func (e *Engine) ImportBusybox(ctx context.Context, busybox string) error {
	layer, err := enginelab.BusyboxRootfs(busybox)
	if err != nil {
		return err
	}
	buf := bytes.NewReader(layer)
	repo, tag, _ := strings.Cut(Image, ":")
	q := url.Values{"fromSrc": {"-"}, "repo": {repo}, "tag": {tag}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://docker/images/create?"+q.Encode(), buf)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || bytes.Contains(data, []byte(`"errorDetail"`)) {
		return fmt.Errorf("import image: HTTP %d %s", resp.StatusCode, data)
	}
	return nil
}

// Run creates and starts a sleeping container of Image on a network, as
// `docker run --net NETWORK` does, and returns its id.
func (e *Engine) Run(ctx context.Context, network string) (string, error) {
	var created struct {
		ID string `json:"Id"`
	}
	body := map[string]any{
		"Image": Image, "Cmd": []string{"/bin/sleep", "3600"},
		"HostConfig": map[string]any{"NetworkMode": network},
	}
	if err := e.CallJSON(ctx, http.MethodPost, "/containers/create", body, &created); err != nil {
		return "", fmt.Errorf("create a container on %s: %w", network, err)
	}
	if err := e.Call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		_ = e.Call(ctx, http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, nil)
		return "", fmt.Errorf("start a container on %s: %w", network, err)
	}
	return created.ID, nil
}

// Remove removes a container (running or not).
func (e *Engine) Remove(ctx context.Context, id string) error {
	return e.Call(ctx, http.MethodDelete, "/containers/"+id+"?force=1", nil, nil)
}

// Endpoint is a container's address on one network, as the engine reports it.
type Endpoint struct {
	IPAddress, Gateway, GlobalIPv6Address, IPv6Gateway, MacAddress string
	IPPrefixLen, GlobalIPv6PrefixLen                               int
}

// Endpoint returns the container's endpoint on a network.
func (e *Engine) Endpoint(ctx context.Context, id, network string) (Endpoint, error) {
	var inspect struct {
		NetworkSettings struct {
			Networks map[string]Endpoint
		}
	}
	if err := e.Call(ctx, http.MethodGet, "/containers/"+id+"/json", nil, &inspect); err != nil {
		return Endpoint{}, err
	}
	ep, ok := inspect.NetworkSettings.Networks[network]
	if !ok {
		return Endpoint{}, fmt.Errorf("container %.12s is not on network %s", id, network)
	}
	return ep, nil
}

// Exec runs cmd in a running container, as `docker exec` does, and returns
// its output (stdout and stderr, demultiplexed) and exit code.
func (e *Engine) Exec(ctx context.Context, id string, cmd ...string) ([]byte, int, error) {
	var created struct {
		ID string `json:"Id"`
	}
	if err := e.CallJSON(ctx, http.MethodPost, "/containers/"+id+"/exec", map[string]any{
		"Cmd": cmd, "AttachStdout": true, "AttachStderr": true,
	}, &created); err != nil {
		return nil, 0, fmt.Errorf("exec in %.12s: %w", id, err)
	}
	var raw bytes.Buffer
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://docker/exec/"+created.ID+"/start", strings.NewReader(`{"Detach":false,"Tty":false}`))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("exec in %.12s: %w", id, err)
	}
	_, err = io.Copy(&raw, resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, 0, fmt.Errorf("exec in %.12s: %w", id, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, 0, fmt.Errorf("exec in %.12s: HTTP %d: %s", id, resp.StatusCode, raw.Bytes())
	}
	out := demux(raw.Bytes())
	var inspect struct {
		Running  bool
		ExitCode int
	}
	if err := e.Call(ctx, http.MethodGet, "/exec/"+created.ID+"/json", nil, &inspect); err != nil {
		return out, 0, fmt.Errorf("exec in %.12s: %w", id, err)
	}
	if inspect.Running {
		return out, 0, fmt.Errorf("exec in %.12s: still running after its output ended", id)
	}
	return out, inspect.ExitCode, nil
}

// demux reads Docker's multiplexed stream (8-byte frame headers: stream,
// 3 zero bytes, big-endian length) into one output.
func demux(b []byte) []byte {
	var out []byte
	for len(b) >= 8 {
		n := int(b[4])<<24 | int(b[5])<<16 | int(b[6])<<8 | int(b[7])
		b = b[8:]
		if n > len(b) {
			n = len(b)
		}
		out = append(out, b[:n]...)
		b = b[n:]
	}
	return out
}
