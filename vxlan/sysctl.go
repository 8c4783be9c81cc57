package vxlan

import (
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils/sysctl"
)

// ensureIPv6Forwarding has the kernel forward IPv6 packets that come in on
// one of carve's links (the VTEP, a bridge), and only there: setting
// net.ipv6.conf.all.forwarding instead would turn every interface into a
// router, and an uplink that gets its address or default route from router
// advertisements would stop accepting them. conf/<link>/forwarding makes the
// link a router's (as neighbour discovery announces it); force_forwarding
// (Linux 6.17 and later) forwards what comes in on it whatever conf/all
// says. A kernel without force_forwarding forwards IPv6 only with
// conf/all/forwarding: there it is set, with a warning, since an IPv6
// overlay cannot work otherwise. true means done.
func (d *Dataplane) ensureIPv6Forwarding(link string, rep *Report) bool {
	conf := "net/ipv6/conf/" + link + "/"
	ok := d.setSysctl(conf+"forwarding", "1", rep)
	if d.hasSysctl(conf + "force_forwarding") {
		return d.setSysctl(conf+"force_forwarding", "1", rep) && ok
	}
	if !d.warnedAllForwarding {
		d.warnedAllForwarding = true
		d.log.Warn("vxlan: this kernel cannot forward IPv6 per interface (no net.ipv6.conf.<link>.force_forwarding, Linux < 6.17): "+
			"setting net.ipv6.conf.all.forwarding=1 for the IPv6 overlay; interfaces that rely on router advertisements need accept_ra=2",
			"link", link)
	}
	return d.setSysctl("net/ipv6/conf/all/forwarding", "1", rep) && ok
}

// setSysctl sets a sysctl of the namespace, counting the change or the
// failure in rep; true means it holds value now.
func (d *Dataplane) setSysctl(name, value string, rep *Report) bool {
	changed, err := d.ensureSysctl(name, value)
	switch {
	case err != nil:
		rep.fail(KindSysctl, name, "", "set", err)
		return false
	case changed:
		rep.Sysctls.Updated++
	}
	return true
}

// ensureSysctl sets a sysctl under /proc/sys/net (name is the path below
// /proc/sys, e.g. "net/ipv4/ip_forward") inside the dataplane's namespace,
// when it differs. It runs on a thread inside the namespace because
// /proc/sys/net resolves against the network namespace of the thread that
// opens it.
func (d *Dataplane) ensureSysctl(name, value string) (changed bool, err error) {
	if !strings.HasPrefix(name, "net/") || strings.Contains(name, "..") {
		return false, fmt.Errorf("refusing sysctl %q outside /proc/sys/net", name)
	}
	err = d.inNS(func() error {
		cur, err := sysctl.Sysctl(name)
		if err != nil {
			return err
		}
		if strings.TrimSpace(cur) == value {
			return nil
		}
		changed = true
		_, err = sysctl.Sysctl(name, value)
		return err
	})
	return changed, err
}

// hasSysctl reports whether the kernel has a sysctl under /proc/sys/net in
// the dataplane's namespace.
func (d *Dataplane) hasSysctl(name string) bool {
	return d.inNS(func() error {
		_, err := os.Stat("/proc/sys/" + name)
		return err
	}) == nil
}
