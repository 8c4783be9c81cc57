package agent

// The CNI configurations the agent writes for the runtimes of its host:
// the spec version they declare (chosen once at start), what would keep a
// runtime from loading them, and keeping one per overlay served here.

import (
	"context"
	"fmt"
	"strings"

	"github.com/carve-net/carve/agent/kernel"
	"github.com/carve-net/carve/api"
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
		c := cni.Conflist{Overlay: "x", MTU: kernel.DefaultOverlayMTU, FilePrefix: cfg.CNIConfPrefix}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("agent: --cni-conf-prefix: %w", err)
		}
	}
	return nil
}

// writeConflists keeps one CNI network config per overlay that has a mesos
// bridge here, and removes carve's configs of overlays that went away: the
// conflist in CNIConfDir (in the spec version chosen at start, named with
// CNIConfPrefix) and, with MesosCNIConfDir, the single-plugin .conf of the
// Mesos CNI isolator. A config is written only once the overlay has its
// lease, so a runtime never sees a network the agent cannot serve.
func (a *Agent) writeConflists(self *api.AgentInfo, network *api.NetworkConfig) {
	mtu := kernel.DefaultOverlayMTU
	if network != nil && network.OverlayMTU > 0 {
		mtu = network.OverlayMTU
	}
	var keep []string
	for _, ov := range self.Overlays {
		if kernel.Leased(&ov) && ov.MesosBridge != nil {
			keep = append(keep, ov.Info.Name)
		}
	}
	conflist := func(ov string) cni.Conflist {
		return cni.Conflist{Overlay: ov, MTU: mtu, Socket: a.cfg.Socket, CNIVersion: a.cniVersion, FilePrefix: a.cfg.CNIConfPrefix}
	}
	for _, w := range []struct {
		dir   string
		what  string
		write func(dir string, c cni.Conflist) (bool, error)
		path  func(dir string, c cni.Conflist) string
		prune func(dir string, keep []string) ([]string, error)
	}{
		{a.cfg.CNIConfDir, "CNI config", cni.WriteConflist,
			func(dir string, c cni.Conflist) string { return cni.ConflistPath(dir, c.FilePrefix, c.Overlay) },
			func(dir string, keep []string) ([]string, error) {
				return cni.PruneConflists(dir, a.cfg.CNIConfPrefix, keep)
			}},
		{a.cfg.MesosCNIConfDir, "Mesos CNI config", cni.WriteConf,
			func(dir string, c cni.Conflist) string { return cni.ConfPath(dir, c.Overlay) }, cni.PruneConfs},
	} {
		if w.dir == "" {
			continue
		}
		wroteAny := false
		for _, ov := range keep {
			wrote, err := w.write(w.dir, conflist(ov))
			if err != nil {
				a.log.Error("write "+w.what, "overlay", ov, "dir", w.dir, "err", err)
				continue
			}
			if wrote {
				wroteAny = true
				a.log.Info(w.what+" written", "path", w.path(w.dir, conflist(ov)), "cni_version", a.cniVersion)
			}
		}
		removed, err := w.prune(w.dir, keep)
		if err != nil {
			a.log.Error("prune "+w.what+"s", "dir", w.dir, "err", err)
		}
		for _, path := range removed {
			a.log.Info(w.what+" removed (overlay gone)", "path", path)
		}
		if wroteAny && w.dir == a.cfg.CNIConfDir {
			a.warnNotFirst(w.dir)
		}
	}
}
