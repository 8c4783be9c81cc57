package cnihost

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
)

func writeResult(t *testing.T, cache, name, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(cache, "results"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "results", name), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReadResults: the results of one network are read with their
// addresses and owner; other networks, unreadable entries and invalid
// names are skipped; a cache that does not exist holds nothing.
func TestReadResults(t *testing.T) {
	cache := t.TempDir()
	if got, err := ReadResults(cache, "carve"); err != nil || got != nil {
		t.Fatalf("an empty cache: %v, %v", got, err)
	}
	entry := `{"kind":"cniCacheV1","containerId":%q,"ifName":"eth0","networkName":%q,"netns":"/run/netns/cni-1",` +
		`"cniArgs":[["K8S_POD_NAMESPACE","default"],["K8S_POD_NAME","web"]],"result":{"ips":[{"address":"10.128.0.5/24"},{"address":"bad"},{"address":"fd00::5/64"}]}}`
	writeResult(t, cache, "a", fmt.Sprintf(entry, "c1", "carve"))
	writeResult(t, cache, "b", fmt.Sprintf(entry, "c2", "other"))
	writeResult(t, cache, "c", `{not json`)
	writeResult(t, cache, "d", fmt.Sprintf(entry, "bad id/", "carve"))
	got, err := ReadResults(cache, "carve")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("results %+v, want c1's only", got)
	}
	r := got[0]
	want := []netip.Addr{netip.MustParseAddr("10.128.0.5"), netip.MustParseAddr("fd00::5")}
	if r.ContainerID != "c1" || r.IfName != "eth0" || fmt.Sprint(r.Addrs) != fmt.Sprint(want) {
		t.Errorf("result %+v", r)
	}
	if r.Owner == nil || r.Owner.Runtime != api.RuntimeCNI || r.Owner.NetNS != "/run/netns/cni-1" || r.Owner.ContainerID != "c1" {
		t.Errorf("owner %+v", r.Owner)
	}
}

// TestNetNS: a namespace is watched only directly inside a runtime
// directory, and gone only when its directory exists and it does not.
func TestNetNS(t *testing.T) {
	dir := t.TempDir()
	dirs := NetNSDirs([]string{dir + "/"})
	if len(NetNSDirs(nil)) != len(DefaultNetNSDirs()) {
		t.Error("no directories: not the defaults")
	}
	if err := os.WriteFile(filepath.Join(dir, "cni-live"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path          string
		watched, gone bool
	}{
		{filepath.Join(dir, "cni-live"), true, false},
		{filepath.Join(dir, "cni-gone"), true, true},
		{filepath.Join(dir, "sub", "cni-x"), false, false},
		{filepath.Join(dir, "..", "cni-x"), false, false},
		{"relative/cni-x", false, false},
		{"", false, false},
	} {
		if got := Watched(dirs, tt.path); got != tt.watched {
			t.Errorf("Watched(%q) = %v", tt.path, got)
		}
		if tt.watched {
			if got := NetNSGone(tt.path); got != tt.gone {
				t.Errorf("NetNSGone(%q) = %v", tt.path, got)
			}
		}
	}
	if NetNSGone(filepath.Join(dir, "missing-dir", "cni-x")) {
		t.Error("a namespace in a directory that does not exist counts as gone")
	}
}
