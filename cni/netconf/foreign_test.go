package netconf

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestPruneLeavesForeignFiles: the conflist directory is shared with other
// engines (Podman in netavark mode wrote netavark.lock and its networks'
// .json into /etc/cni/net.d), so pruning removes carve's files only and
// neither fails nor blocks on anything else there: another engine's lock,
// configurations and temporary files, a conflist that is not JSON, a
// directory, a link and a FIFO with a conflist's name. It removes carve's
// conflist of an overlay gone and carve's crash leftovers beside them.
func TestPruneLeavesForeignFiles(t *testing.T) {
	dir := t.TempDir()
	for _, ov := range []string{"keep", "gone"} {
		if _, err := WriteConflist(dir, Conflist{Overlay: ov, MTU: 1420}); err != nil {
			t.Fatal(err)
		}
	}
	carveData, err := Conflist{Overlay: "crashed", MTU: 1420}.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	otherList := []byte(`{"cniVersion":"0.4.0","name":"podman","plugins":[{"type":"bridge","bridge":"cni-podman0","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local"}}]}`)
	foreign := map[string][]byte{
		"netavark.lock":              nil, // Podman 4 in netavark mode
		"cni.lock":                   nil, // Podman 4.3.1's CNI backend, seen here
		"podman.json":                []byte(`{"name":"podman","driver":"bridge","network_interface":"podman0","internal":false}`),
		"87-podman-bridge.conflist":  otherList,
		"broken.conflist":            []byte("{not json"),
		"empty.conflist":             nil,
		".podman.conflist.tmp-12345": otherList, // another engine's write in flight
		".other.conflist.tmp-42":     []byte("{"),
		".x.conflist.tmp-":           []byte("{"), // not atomicfile's shape
		".keep.conflist.tmp-abc":     carveData,   // nor is this
	}
	for name, data := range foreign {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Carve's leftovers: a complete temporary file of an overlay gone, and
	// a partial one of an overlay carve keeps.
	for name, data := range map[string][]byte{".crashed.conflist.tmp-777": carveData, ".keep.conflist.tmp-778": []byte(`{"cniVer`)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.conflist"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ConflistPath(dir, "", "gone"), filepath.Join(dir, "link.conflist")); err != nil {
		t.Fatal(err)
	}
	// Reading a FIFO blocks until a writer comes: prune must not open it.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.conflist"), 0o644); err != nil {
		t.Fatal(err)
	}
	removed, err := PruneConflists(dir, "", []string{"keep"})
	if err != nil {
		t.Fatalf("PruneConflists: %v", err)
	}
	if want := []string{ConflistPath(dir, "", "gone")}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	want := []string{"keep.conflist", "dir.conflist", "link.conflist", "fifo.conflist"}
	for name, data := range foreign {
		want = append(want, name)
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != string(data) {
			t.Errorf("%s changed: %v %q", name, err, got)
		}
	}
	slices.Sort(want)
	assertOnlyFiles(t, dir, want...)
	// FirstConfig (the agent's warning that another file sorts first)
	// reads past them too.
	if name, isCarve, err := FirstConfig(dir); err != nil || name != "87-podman-bridge.conflist" || isCarve {
		t.Errorf("FirstConfig = %q, %v, %v; want 87-podman-bridge.conflist, not carve's", name, isCarve, err)
	}
}

func TestTempOf(t *testing.T) {
	for _, tc := range []struct {
		name, ext, target string
		ok                bool
	}{
		{".a.conflist.tmp-123", ConflistExt, "a.conflist", true},
		{".10-a.conflist.tmp-9", ConflistExt, "10-a.conflist", true},
		{".a.conf.tmp-1", ConfExt, "a.conf", true},
		{".a.conflist.tmp-1", ConfExt, "", false},
		{".a.conf.tmp-1", ConflistExt, "", false},
		{"a.conflist.tmp-1", ConflistExt, "", false},
		{".a.conflist.tmp-", ConflistExt, "", false},
		{".a.conflist.tmp-1x", ConflistExt, "", false},
		{"..conflist.tmp-1", ConflistExt, "", false},
		{".netavark.lock", ConflistExt, "", false},
	} {
		target, ok := TempOf(tc.name, tc.ext)
		if target != tc.target || ok != tc.ok {
			t.Errorf("TempOf(%q, %q) = %q, %v; want %q, %v", tc.name, tc.ext, target, ok, tc.target, tc.ok)
		}
	}
}
