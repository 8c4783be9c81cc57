package netnslab

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// release closes the namespace's handles and removes its mount.
func (n *Namespace) release() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released {
		return nil
	}
	n.released = true
	for _, h := range n.handles {
		h.Close()
	}
	n.handles = nil
	var errs []error
	if n.ns != nil {
		if err := n.ns.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := RemoveMount(n.Path); err != nil {
		errs = append(errs, fmt.Errorf("remove namespace %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// handle returns the open namespace handle, or an error once released.
func (n *Namespace) handle() (ns.NetNS, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released || n.ns == nil {
		return nil, fmt.Errorf("netnslab: namespace %s is closed", n.Name)
	}
	return n.ns, nil
}

// Do runs fn on an OS thread that is inside the namespace, and puts the
// thread back afterwards (a thread that cannot be put back is discarded).
// fn must not start goroutines that expect to be inside the namespace.
func (n *Namespace) Do(fn func() error) error {
	h, err := n.handle()
	if err != nil {
		return err
	}
	return h.Do(func(ns.NetNS) error { return fn() })
}

// NsHandle returns the lab's own handle on the namespace, for APIs that take a
// netns.NsHandle (e.g. vxlan.Options.NetNS). It stays owned by the lab: do not
// close it; it is valid until Close (copy it with unix.Dup to keep it longer).
func (n *Namespace) NsHandle() netns.NsHandle {
	h, err := n.handle()
	if err != nil {
		return netns.None()
	}
	return netns.NsHandle(int(h.Fd()))
}

// Netlink returns a netlink handle bound to the namespace. The lab closes it
// on Close (closing it earlier is fine).
func (n *Namespace) Netlink() (*netlink.Handle, error) {
	if _, err := n.handle(); err != nil {
		return nil, err
	}
	nh, err := netlink.NewHandleAt(n.NsHandle())
	if err != nil {
		return nil, fmt.Errorf("netnslab: netlink handle in %s: %w", n.Name, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.released {
		nh.Close()
		return nil, fmt.Errorf("netnslab: namespace %s is closed", n.Name)
	}
	n.handles = append(n.handles, nh)
	return nh, nil
}

// withNetlink runs fn with a short-lived handle, so that setup code does not
// accumulate sockets (which would also pin the namespace). The handle
// retries the lookups a concurrent change interrupts (netlinksafe).
func (n *Namespace) withNetlink(fn func(netlinksafe.Handle) error) error {
	if _, err := n.handle(); err != nil {
		return err
	}
	nh, err := netlinksafe.NewHandleAt(n.NsHandle())
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", n.Name, err)
	}
	defer nh.Close()
	return fn(nh)
}

// Start starts cmd inside the namespace (the child inherits the namespace of
// the thread that forks it). The lab kills it on Close if it still runs; the
// caller still owns cmd and should Wait for it. Do not set
// cmd.SysProcAttr.Pdeathsig: it fires when the forking thread exits, and the
// thread used here may be discarded.
func (n *Namespace) Start(cmd *exec.Cmd) error {
	n.lab.mu.Lock()
	closed := n.lab.closed
	n.lab.mu.Unlock()
	if closed {
		return errors.New("netnslab: lab is closed")
	}
	if err := n.Do(cmd.Start); err != nil {
		return err
	}
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	if n.lab.closed {
		// Close ran meanwhile: do not leave the process behind.
		_ = cmd.Process.Kill()
		return errors.New("netnslab: lab is closed")
	}
	n.lab.procs = append(n.lab.procs, cmd.Process)
	return nil
}

// Run starts cmd inside the namespace and waits for it.
func (n *Namespace) Run(cmd *exec.Cmd) error {
	if err := n.Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// ExecArgs returns argv that runs args inside the namespace through
// `ip netns exec` (needs iproute2), for shells and scripts.
func (n *Namespace) ExecArgs(args ...string) []string {
	return append([]string{"ip", "netns", "exec", n.Name}, args...)
}

// checkNetSysctl refuses names outside net.*: only those are per network
// namespace, so any other would change the whole machine.
func checkNetSysctl(name string) error {
	if !strings.HasPrefix(name, "net.") || strings.Contains(name, "..") || strings.Contains(name, "/") {
		return fmt.Errorf("netnslab: only net.* sysctls are per namespace, not %q", name)
	}
	return nil
}

// Sysctl reads a net.* sysctl as seen from inside the namespace (/proc/sys/net
// resolves against the network namespace of the reading thread).
func (n *Namespace) Sysctl(name string) (string, error) {
	if err := checkNetSysctl(name); err != nil {
		return "", err
	}
	var v string
	err := n.Do(func() error {
		var err error
		v, err = sysctl.Sysctl(name)
		return err
	})
	return strings.TrimSpace(v), err
}

// SetSysctl writes a net.* sysctl inside the namespace only.
func (n *Namespace) SetSysctl(name, value string) error {
	if err := checkNetSysctl(name); err != nil {
		return err
	}
	return n.Do(func() error {
		_, err := sysctl.Sysctl(name, value)
		return err
	})
}

// Inode returns the inode number that identifies the namespace (the one
// /proc/PID/ns/net links to), to check which namespace a process is in.
func (n *Namespace) Inode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(n.Path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
