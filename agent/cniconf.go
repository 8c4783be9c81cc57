package agent

// What the agent learns once at start about the CNI runtimes of its host:
// the spec version its conflists declare, and what would keep a runtime
// from loading them.

import (
	"context"
	"fmt"
	"strings"

	cni "github.com/carve-net/carve/cni/netconf"
)

// chooseCNIVersion fixes the spec version of the conflists, once, before the
// reconcile loop writes any: CNIVersion when set, else what every plugin of
// the chain in CNIBinDirs and every runtime on the host reads. It logs the
// choice with its reason, and a warning for each way a runtime could fail
// to load the conflists, naming the fix. CNI ADDs never wait on it: the
// plugins are asked here only.
func (a *Agent) chooseCNIVersion(ctx context.Context) {
	a.cniVersion = cni.BaseCNIVersion
	if a.cfg.CNIConfDir == "" {
		return
	}
	choice := cni.ChooseVersion(ctx, a.cfg.CNIBinDirs, cni.FindRuntimes(ctx))
	v, reason := choice.Version, choice.Reason
	if a.cfg.CNIVersion != "" && a.cfg.CNIVersion != "auto" {
		v, reason = a.cfg.CNIVersion, "set by --cni-version (detection would choose "+choice.Version+": "+choice.Reason+")"
	}
	a.cniVersion = v
	var runtimes []string
	for _, r := range choice.Runtimes {
		runtimes = append(runtimes, r.Name+" "+r.Version)
	}
	a.log.Info("CNI spec version chosen", "version", v, "reason", reason,
		"bin_dirs", strings.Join(a.cfg.CNIBinDirs, ":"), "runtimes", strings.Join(runtimes, ", "))
	for _, w := range cni.Warnings(choice, v, a.cfg.CNIConfDir, a.cfg.CNIBinDirs) {
		a.log.Warn(w)
	}
}

// warnNotFirst warns when a configuration carve did not write sorts first
// in dir: containerd's CRI (max_conf_num = 1) and CRI-O load only that one.
func (a *Agent) warnNotFirst(dir string) {
	name, isCarve, err := cni.FirstConfig(dir)
	if err != nil || name == "" || isCarve {
		return
	}
	a.log.Warn("another CNI configuration sorts before carve's: containerd's CRI (max_conf_num = 1) and CRI-O load only the first file in lexical order; set --cni-conf-prefix to sort carve's first (e.g. 00-) or remove it",
		"dir", dir, "first", name)
}

// checkCNIConfig refuses a spec version carve does not write and a file
// name prefix that is no plain file name start.
func checkCNIConfig(cfg Config) error {
	if cfg.CNIVersion != "" && cfg.CNIVersion != "auto" {
		if err := cni.ValidVersion(cfg.CNIVersion); err != nil {
			return fmt.Errorf("agent: --cni-version: %w", err)
		}
	}
	if cfg.CNIConfPrefix != "" {
		c := cni.Conflist{Overlay: "x", MTU: defaultOverlayMTU, FilePrefix: cfg.CNIConfPrefix}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("agent: --cni-conf-prefix: %w", err)
		}
	}
	return nil
}
