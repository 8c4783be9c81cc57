package netconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/carve-net/carve/test/lab/testutil"
)

func TestConflistContent(t *testing.T) {
	tests := []struct {
		name, overlay string
		mtu           int
		socket        string
		wantSocket    string
		version       string
		wantVersion   string
	}{
		{"explicit socket", "carve", 1420, "/run/carve/other.sock", "/run/carve/other.sock", "", BaseCNIVersion},
		{"default socket", "ov-2", 9000, "", DefaultSocket, BaseCNIVersion, BaseCNIVersion},
		{"longest name", "abcdefghij-13", 1280, "/s", "/s", LatestCNIVersion, LatestCNIVersion},
		{"for libcni 0.8", "old", 1450, "", DefaultSocket, LegacyCNIVersion, LegacyCNIVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wrote, err := WriteConflist(dir, Conflist{Overlay: tc.overlay, MTU: tc.mtu, Socket: tc.socket, CNIVersion: tc.version})
			if err != nil || !wrote {
				t.Fatalf("WriteConflist = %v, %v; want true, nil", wrote, err)
			}
			path := filepath.Join(dir, tc.overlay+".conflist")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, data)
			}
			want := map[string]any{
				"cniVersion": tc.wantVersion,
				"name":       tc.overlay,
				"plugins": []any{
					map[string]any{
						"type":         "bridge",
						"bridge":       "m-" + tc.overlay,
						"isGateway":    false,
						"ipMasq":       false,
						"hairpinMode":  true,
						"mtu":          float64(tc.mtu),
						"capabilities": map[string]any{"ips": true},
						"ipam": map[string]any{
							"type":    "carve-ipam",
							"network": tc.overlay,
							"bridge":  "mesos",
							"socket":  tc.wantSocket,
						},
					},
					map[string]any{
						"type":         "portmap",
						"capabilities": map[string]any{"portMappings": true},
					},
				},
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("conflist:\n%s\nwant the equivalent of %#v", data, want)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("mode = %v, %v; want 0644", fi.Mode(), err)
			}

			// libcni, as runtimes use it, accepts it and finds it by name.
			list, err := libcni.ConfListFromBytes(data)
			if err != nil {
				t.Fatalf("libcni.ConfListFromBytes: %v", err)
			}
			if list.Name != tc.overlay || list.CNIVersion != tc.wantVersion || len(list.Plugins) != 2 {
				t.Fatalf("libcni list = %s %s with %d plugins", list.Name, list.CNIVersion, len(list.Plugins))
			}
			if p := list.Plugins[0].Network; p.Type != "bridge" || p.IPAM.Type != PluginType {
				t.Errorf("plugin 0 = %s with ipam %s", p.Type, p.IPAM.Type)
			}
			if p := list.Plugins[1].Network; p.Type != "portmap" || !p.Capabilities["portMappings"] {
				t.Errorf("plugin 1 = %s with capabilities %v", p.Type, p.Capabilities)
			}
			loaded, err := libcni.LoadNetworkConf(dir, tc.overlay)
			if err != nil || loaded.Name != tc.overlay {
				t.Fatalf("libcni.LoadNetworkConf(%s) = %v, %v", tc.overlay, loaded, err)
			}
		})
	}
}

func TestConflistRejectsInvalidInput(t *testing.T) {
	tests := []struct {
		name, overlay string
		mtu           int
		socket        string
		wantErr       string
	}{
		{"empty name", "", 1420, "", "1-13 characters"},
		{"name too long for m-<name>", "abcdefghijklmn", 1420, "", "1-13 characters"},
		{"upper case", "Carve", 1420, "", "[a-z0-9-]"},
		{"path in name", "../etc", 1420, "", "[a-z0-9-]"},
		{"name Docker reserves", "bridge", 1420, "", "reserved"},
		{"name CNI reserves", "none", 1420, "", "reserved"},
		{"zero mtu", "carve", 0, "", "mtu 0"},
		{"huge mtu", "carve", 70000, "", "mtu 70000"},
		{"relative socket", "carve", 1420, "run/agent.sock", "absolute"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wrote, err := WriteConflist(dir, Conflist{Overlay: tc.overlay, MTU: tc.mtu, Socket: tc.socket})
			if err == nil || wrote || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("WriteConflist = %v, %v; want an error containing %q", wrote, err, tc.wantErr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("directory not empty after a refused write: %v", entries)
			}
		})
	}
}

func TestWriteConflistIdempotent(t *testing.T) {
	dir := t.TempDir()
	path := ConflistPath(dir, "", "carve")
	if wrote, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420}); err != nil || !wrote {
		t.Fatalf("first write = %v, %v", wrote, err)
	}
	// Age the file, so that a rewrite would show in its mtime and inode.
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	for i := 0; i < 3; i++ {
		if wrote, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420}); err != nil || wrote {
			t.Fatalf("unchanged write %d = %v, %v; want false, nil", i, wrote, err)
		}
	}
	after, _ := os.Stat(path)
	if !after.ModTime().Equal(old) || !os.SameFile(before, after) {
		t.Errorf("unchanged content was rewritten: mtime %v (was %v), same file %v", after.ModTime(), old, os.SameFile(before, after))
	}

	// A change is written, and only the overlay's own file.
	if wrote, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1380}); err != nil || !wrote {
		t.Fatalf("changed write = %v, %v; want true, nil", wrote, err)
	}
	data, _ := os.ReadFile(path)
	if !bytes.Contains(data, []byte(`"mtu": 1380`)) {
		t.Errorf("new mtu not written:\n%s", data)
	}
	assertOnlyFiles(t, dir, "carve.conflist")
}

// assertOnlyFiles checks that dir holds exactly the named files (no
// temporary file left behind).
func assertOnlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

// TestWriteConflistAtomic has readers load the file while it is rewritten
// over and over: every read must see one complete version, never an empty,
// partial or missing file, and libcni never sees the temporary files.
func TestWriteConflistAtomic(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420}); err != nil {
		t.Fatal(err)
	}
	versions := map[string]bool{}
	for _, mtu := range []int{1420, 1421} {
		b, err := Conflist{Overlay: "carve", MTU: mtu}.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		versions[string(b)] = true
	}

	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				reads.Add(1)
				data, err := os.ReadFile(ConflistPath(dir, "", "carve"))
				if err != nil || !versions[string(data)] {
					errs <- "read " + string(data) + ": " + errString(err)
					return
				}
				files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
				if err != nil || len(files) != 1 {
					errs <- "libcni.ConfFiles = " + strings.Join(files, ",") + ": " + errString(err)
					return
				}
			}
		}()
	}
	// At least 300 rewrites, and on until the readers have read 300 times
	// (bounded: a reader that stops early has reported why).
	deadline := time.Now().Add(testutil.WaitLimit)
	for i := 0; i < 300 || reads.Load() < 300 && len(errs) == 0 && time.Now().Before(deadline); i++ {
		if _, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420 + i%2}); err != nil {
			t.Error(err)
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := reads.Load(); n < 300 && !t.Failed() {
		t.Errorf("the readers read %d times during the rewrites, want at least 300", n)
	}
	assertOnlyFiles(t, dir, "carve.conflist")
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestWriteConflistFailureLeavesNoTemp makes the final rename fail (the
// target is a non-empty directory): the error names the path and the
// temporary file is gone.
func TestWriteConflistFailureLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	blocker := ConflistPath(dir, "", "carve")
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	wrote, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420})
	if err == nil || wrote || !strings.Contains(err.Error(), blocker) {
		t.Fatalf("WriteConflist over a directory = %v, %v; want an error naming %s", wrote, err, blocker)
	}
	assertOnlyFiles(t, dir, "carve.conflist")
	// A directory that cannot be created (a file is in the way).
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteConflist(filepath.Join(file, "net.d"), Conflist{Overlay: "carve", MTU: 1420}); err == nil {
		t.Error("WriteConflist under a regular file succeeded")
	}
}

func TestWriteConflistCreatesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "cni", "net.d")
	if wrote, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420}); err != nil || !wrote {
		t.Fatalf("WriteConflist into a missing directory = %v, %v", wrote, err)
	}
	assertOnlyFiles(t, dir, "carve.conflist")
}

func TestRemoveConflist(t *testing.T) {
	tests := []struct {
		name        string
		content     string // "" for no file; "carve" for a WriteConflist
		wantRemoved bool
	}{
		{"carve's file", "carve", true},
		{"no file", "", false},
		{"someone else's file", `{"cniVersion":"1.0.0","name":"carve","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`, false},
		{"not JSON", "garbage", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := ConflistPath(dir, "", "carve")
			switch tc.content {
			case "":
			case "carve":
				if _, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420}); err != nil {
					t.Fatal(err)
				}
			default:
				if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			removed, err := RemoveConflist(dir, "carve")
			if err != nil || removed != tc.wantRemoved {
				t.Fatalf("RemoveConflist = %v, %v; want %v, nil", removed, err, tc.wantRemoved)
			}
			_, statErr := os.Stat(path)
			if exists := statErr == nil; exists != (tc.content != "" && !tc.wantRemoved) {
				t.Errorf("file exists = %v after RemoveConflist", exists)
			}
			if removed, err := RemoveConflist(dir, "carve"); err != nil || removed {
				t.Errorf("second RemoveConflist = %v, %v; want false, nil", removed, err)
			}
		})
	}
	if _, err := RemoveConflist(t.TempDir(), "../x"); err == nil {
		t.Error("RemoveConflist accepted an invalid overlay name")
	}
}

func TestPruneConflists(t *testing.T) {
	dir := t.TempDir()
	for _, ov := range []string{"a", "b", "c"} {
		if _, err := WriteConflist(dir, Conflist{Overlay: ov, MTU: 1420}); err != nil {
			t.Fatal(err)
		}
	}
	foreign := []byte(`{"cniVersion":"1.0.0","name":"f","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`)
	for name, data := range map[string][]byte{
		"foreign.conflist":       foreign,
		"notes.txt":              []byte("x"),
		".b.conflist.tmp-123456": []byte("{"), // a crash's leftover
		"10-other.conf":          foreign,
		".c.conflist.tmp-789":    []byte("{"), // leftover of an overlay carve still has: also ours
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := PruneConflists(dir, "", []string{"a", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ConflistPath(dir, "", "b")}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	assertOnlyFiles(t, dir, "a.conflist", "c.conflist", "foreign.conflist", "notes.txt", "10-other.conf")
	if removed, err := PruneConflists(filepath.Join(dir, "missing"), "", nil); err != nil || removed != nil {
		t.Errorf("PruneConflists(missing dir) = %v, %v", removed, err)
	}
}

// TestPruneConflistsAfterPrefixChange: carve's files are found by content,
// so the files of an earlier --cni-conf-prefix go once the agent writes
// under a new one, and a foreign file with carve's name stays.
func TestPruneConflistsAfterPrefixChange(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []Conflist{
		{Overlay: "a", MTU: 1420},
		{Overlay: "a", MTU: 1420, FilePrefix: "10-"},
		{Overlay: "b", MTU: 1420, FilePrefix: "05-"},
		{Overlay: "c", MTU: 1420, FilePrefix: "99-"},
	} {
		if _, err := WriteConflist(dir, c); err != nil {
			t.Fatal(err)
		}
	}
	foreign := []byte(`{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`)
	if err := os.WriteFile(filepath.Join(dir, "00-a.conflist"), foreign, 0o644); err != nil {
		t.Fatal(err)
	}
	removed, err := PruneConflists(dir, "99-", []string{"a", "c"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "05-b.conflist"), filepath.Join(dir, "10-a.conflist"), filepath.Join(dir, "a.conflist")}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	assertOnlyFiles(t, dir, "00-a.conflist", "99-c.conflist")
}

// TestConflistFilePrefix: the prefix names the file, never its content,
// and only plain file name starts are taken.
func TestConflistFilePrefix(t *testing.T) {
	dir := t.TempDir()
	c := Conflist{Overlay: "carve", MTU: 1420, FilePrefix: "10-"}
	if _, err := WriteConflist(dir, c); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "10-carve.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Conflist{Overlay: "carve", MTU: 1420}.Bytes()
	if err != nil || !bytes.Equal(data, plain) {
		t.Errorf("10-carve.conflist differs from the unprefixed rendering (%v):\n%s", err, data)
	}
	for _, bad := range []string{"../", "a/b", ".hidden-"} {
		if _, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420, FilePrefix: bad}); err == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
	if _, err := WriteConflist(dir, Conflist{Overlay: "carve", MTU: 1420, CNIVersion: "0.3.1"}); !errors.Is(err, ErrVersion) {
		t.Errorf("version 0.3.1: %v, want ErrVersion", err)
	}
}
