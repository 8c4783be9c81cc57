// Package cnihost reads what CNI runtimes leave on a host: libcni's cache
// of ADD results (which container holds which addresses on which network,
// in which network namespace, named how by its ADD) and whether a network
// namespace path is gone. It reads files and decides nothing: agent/ipam
// takes back, or lets go of, the addresses it finds.
package cnihost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/carve-net/carve/api"
)

// DefaultNetNSDirs are the directories where runtimes keep network
// namespaces: iproute2, CNI's and Podman's /run/netns (netns-*),
// containerd's cni-* there and its CRI state's netns/.
func DefaultNetNSDirs() []string {
	return []string{
		"/run/netns",
		"/var/run/netns",
		"/run/containerd/io.containerd.grpc.v1.cri/netns",
		"/var/run/containerd/io.containerd.grpc.v1.cri/netns",
	}
}

// NetNSDirs are the runtime directories whose namespaces are watched,
// each cleaned; DefaultNetNSDirs when dirs is empty.
func NetNSDirs(dirs []string) []string {
	if len(dirs) == 0 {
		dirs = DefaultNetNSDirs()
	}
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		out = append(out, filepath.Clean(d))
	}
	return out
}

// Watched tells whether path is a namespace directly inside one of dirs
// (cleaned, as NetNSDirs gives them): runtimes keep them flat.
func Watched(dirs []string, path string) bool {
	if path == "" || !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false
	}
	dir := filepath.Dir(path)
	for _, d := range dirs {
		if dir == d {
			return true
		}
	}
	return false
}

// NetNSGone tells whether a namespace path is gone for sure: the path does
// not exist while its directory does (a directory this process cannot
// see, as from another mount namespace, proves nothing).
func NetNSGone(path string) bool {
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		return false
	}
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// Result is one cached ADD result of a network.
type Result struct {
	ContainerID string
	IfName      string
	// Addrs are the result's addresses that parse, in its order.
	Addrs []netip.Addr
	// Owner is the container as its ADD named it (CNI_ARGS, with the
	// container id, interface and namespace path); identity pairs that do
	// not parse are left out.
	Owner *api.Owner
}

// cacheEntry is the part of libcni's cached ADD result read here.
type cacheEntry struct {
	ContainerID string `json:"containerId"`
	IfName      string `json:"ifName"`
	NetworkName string `json:"networkName"`
	NetNS       string `json:"netns"`
	// CNIArgs are the CNI_ARGS pairs of the ADD ([[key, value], ...]).
	CNIArgs [][2]string `json:"cniArgs"`
	Result  struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	} `json:"result"`
}

// owner is the entry's container as its ADD named it.
func (e cacheEntry) owner() *api.Owner {
	pairs := make([]string, 0, len(e.CNIArgs))
	for _, kv := range e.CNIArgs {
		pairs = append(pairs, kv[0]+"="+kv[1])
	}
	args, err := api.ParseCNIArgs(strings.Join(pairs, ";"))
	if err != nil {
		args = api.CNIArgs{}
	}
	o := args.Owner
	o.Runtime, o.ContainerID, o.IfName, o.NetNS = api.RuntimeCNI, e.ContainerID, e.IfName, e.NetNS
	if o.Validate() != nil {
		return &api.Owner{Runtime: api.RuntimeCNI, ContainerID: e.ContainerID, IfName: e.IfName}
	}
	return &o
}

// ReadResults reads the cached ADD results of network in a libcni cache
// directory (its results/), in file name order. A cache that does not
// exist holds none; entries that cannot be read, of other networks, or
// with an invalid container id or interface are skipped (a runtime's
// cache is not this agent's to judge).
func ReadResults(cacheDir, network string) ([]Result, error) {
	files, err := os.ReadDir(filepath.Join(cacheDir, "results"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the CNI cache %s: %w", cacheDir, err)
	}
	var out []Result
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(cacheDir, "results", f.Name()))
		if err != nil {
			continue
		}
		var e cacheEntry
		if json.Unmarshal(data, &e) != nil || e.NetworkName != network ||
			api.ValidateContainerID(e.ContainerID) != nil || api.ValidateIfName(e.IfName) != nil {
			continue
		}
		r := Result{ContainerID: e.ContainerID, IfName: e.IfName, Owner: e.owner()}
		for _, ip := range e.Result.IPs {
			if p, err := netip.ParsePrefix(ip.Address); err == nil {
				r.Addrs = append(r.Addrs, p.Addr())
			}
		}
		out = append(out, r)
	}
	return out, nil
}
