package containerdlab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// podUID is the uid RunPod gives a pod (a kubelet's is the API object's):
// derived from its namespace and name, so that tests can expect it.
func podUID(name, namespace string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return hex.EncodeToString(sum[:16])
}

// podConfig is the PodSandboxConfig RunPod gives `crictl runp`: what a
// kubelet sends for a pod with the pod network (namespace mode POD) and the
// lab's parent cgroup.
func (c *Containerd) podConfig(name, namespace string) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"metadata": map[string]any{
			"name": name, "namespace": namespace,
			"uid": podUID(name, namespace), "attempt": 0,
		},
		"hostname":      name,
		"log_directory": filepath.Join(c.dir, podsDirName, namespace+"_"+name),
		"linux": map[string]any{
			"cgroup_parent": "/" + c.opts.CgroupParent,
			"security_context": map[string]any{
				"namespace_options": map[string]any{"network": 0, "pid": 0, "ipc": 0},
			},
		},
	}, "", "  ")
}

// RunPod runs a pod sandbox, as a kubelet does (`crictl runp`): the CRI
// plugin creates its network namespace and calls CNI ADD with the conflist
// of CNIConfDir. It returns the pod's id.
func (c *Containerd) RunPod(ctx context.Context, name, namespace string) (string, error) {
	cfg, err := c.podConfig(name, namespace)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(c.dir, podsDirName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("containerdlab: %w", err)
	}
	file := filepath.Join(dir, namespace+"_"+name+".json")
	if err := os.WriteFile(file, cfg, 0o644); err != nil {
		return "", fmt.Errorf("containerdlab: %w", err)
	}
	out, err := c.Crictl(ctx, "runp", file)
	if err != nil {
		return "", fmt.Errorf("containerdlab: run pod %s/%s: %w", namespace, name, err)
	}
	id := strings.TrimSpace(string(out))
	if id == "" {
		return "", fmt.Errorf("containerdlab: run pod %s/%s: crictl printed no id", namespace, name)
	}
	return id, nil
}

// Pod is what `crictl inspectp` says of a pod sandbox.
type Pod struct {
	Status struct {
		ID       string `json:"id"`
		State    string `json:"state"` // SANDBOX_READY, SANDBOX_NOTREADY
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Network struct {
			IP            string `json:"ip"`
			AdditionalIPs []struct {
				IP string `json:"ip"`
			} `json:"additionalIps"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		// PID is the pause process's.
		PID         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
		// CNIResult is the result of the conflist's ADD, as the CRI
		// plugin keeps it.
		CNIResult json.RawMessage `json:"cniResult"`
	} `json:"info"`
}

// NetNS is the path of the pod's network namespace as containerd sees it
// (in its mount namespace); empty when it has none.
func (p *Pod) NetNS() string {
	for _, ns := range p.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			return ns.Path
		}
	}
	return ""
}

// InspectPod returns what the CRI says of a pod.
func (c *Containerd) InspectPod(ctx context.Context, podID string) (*Pod, error) {
	out, err := c.Crictl(ctx, "inspectp", "--output", "json", podID)
	if err != nil {
		return nil, fmt.Errorf("containerdlab: %w", err)
	}
	var p Pod
	if err := json.Unmarshal(out, &p); err != nil {
		return nil, fmt.Errorf("containerdlab: inspectp %.12s: %w", podID, err)
	}
	return &p, nil
}

// PodIP returns the pod's (first) address, the one CNI ADD gave it.
func (c *Containerd) PodIP(ctx context.Context, podID string) (netip.Addr, error) {
	p, err := c.InspectPod(ctx, podID)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := netip.ParseAddr(p.Status.Network.IP)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("containerdlab: pod %.12s has no address (%q): %w", podID, p.Status.Network.IP, err)
	}
	return a, nil
}

// StopPod stops a pod (`crictl stopp`): the CRI plugin calls CNI DEL and
// kills the pod's processes.
func (c *Containerd) StopPod(ctx context.Context, podID string) error {
	if _, err := c.Crictl(ctx, "stopp", podID); err != nil {
		return fmt.Errorf("containerdlab: %w", err)
	}
	return nil
}

// RemovePod removes a stopped pod (`crictl rmp`).
func (c *Containerd) RemovePod(ctx context.Context, podID string) error {
	if _, err := c.Crictl(ctx, "rmp", podID); err != nil {
		return fmt.Errorf("containerdlab: %w", err)
	}
	return nil
}

// Exec runs argv (a program of this machine, e.g. /bin/busybox ping) in the
// pod's network namespace, entered through nsenter by the path inspectp
// gives, and returns its combined output.
func (c *Containerd) Exec(ctx context.Context, podID string, argv ...string) ([]byte, error) {
	p, err := c.InspectPod(ctx, podID)
	if err != nil {
		return nil, err
	}
	ns := p.NetNS()
	if ns == "" {
		return nil, fmt.Errorf("containerdlab: pod %.12s has no network namespace", podID)
	}
	if len(argv) == 0 {
		return nil, errors.New("containerdlab: Exec with no command")
	}
	// The path is a bind mount in containerd's mount namespace: reach it
	// through the holder's root.
	path := fmt.Sprintf("/proc/%d/root%s", c.mnt.PID(), ns)
	out, err := exec.CommandContext(ctx, c.opts.Bins["nsenter"], append([]string{"--net=" + path, "--"}, argv...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("containerdlab: %s in pod %.12s: %w: %s", strings.Join(argv, " "), podID, err, out)
	}
	return out, nil
}
