package netconf

import (
	"encoding/json"
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

// TestConfContent: the Mesos CNI isolator's file is one plugin with a
// top-level type, in version 0.3.1, and its plugin is exactly the bridge
// plugin (with carve-ipam) of the conflist the agent writes for the same
// overlay.
func TestConfContent(t *testing.T) {
	tests := []struct {
		name, overlay string
		mtu           int
		socket        string
		wantSocket    string
	}{
		{"explicit socket", "dcos", 1420, "/run/carve/other.sock", "/run/carve/other.sock"},
		{"default socket", "ov-2", 9000, "", DefaultSocket},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wrote, err := WriteConf(dir, Conflist{Overlay: tc.overlay, MTU: tc.mtu, Socket: tc.socket})
			if err != nil || !wrote {
				t.Fatalf("WriteConf = %v, %v; want true, nil", wrote, err)
			}
			path := filepath.Join(dir, tc.overlay+".conf")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, data)
			}
			want := map[string]any{
				"cniVersion":   "0.3.1",
				"name":         tc.overlay,
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
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("conf:\n%s\nwant the equivalent of %#v", data, want)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("mode = %v, %v; want 0644", fi, err)
			}

			// The plugin is the conflist's first one, key for key.
			listData, err := Conflist{Overlay: tc.overlay, MTU: tc.mtu, Socket: tc.socket}.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			var list struct {
				Plugins []map[string]any `json:"plugins"`
			}
			if err := json.Unmarshal(listData, &list); err != nil {
				t.Fatal(err)
			}
			plugin := map[string]any{}
			for k, v := range got {
				if k != "cniVersion" && k != "name" {
					plugin[k] = v
				}
			}
			if !reflect.DeepEqual(plugin, list.Plugins[0]) {
				t.Errorf("the conf's plugin %v differs from the conflist's bridge plugin %v", plugin, list.Plugins[0])
			}

			// libcni's single-plugin loader accepts it and finds it by
			// name; its list loader sees it as a list of that one plugin.
			//lint:ignore SA1019 the Mesos CNI isolator reads this single-plugin format: libcni's loader for it stands in for the isolator
			conf, err := libcni.LoadConf(dir, tc.overlay)
			if err != nil {
				t.Fatalf("libcni.LoadConf: %v", err)
			}
			if conf.Network.Name != tc.overlay || conf.Network.CNIVersion != "0.3.1" || conf.Network.Type != "bridge" || conf.Network.IPAM.Type != PluginType {
				t.Errorf("libcni conf = %+v", conf.Network)
			}
			if !IsCarveConflist(data) {
				t.Error("IsCarveConflist does not recognise the conf")
			}
		})
	}
}

func TestConfRejectsInvalidInput(t *testing.T) {
	for _, tc := range []struct {
		name, overlay string
		mtu           int
		socket        string
	}{
		{"path in name", "../etc", 1420, ""},
		{"zero mtu", "carve", 0, ""},
		{"relative socket", "carve", 1420, "run/agent.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if wrote, err := WriteConf(dir, Conflist{Overlay: tc.overlay, MTU: tc.mtu, Socket: tc.socket}); err == nil || wrote {
				t.Fatalf("WriteConf = %v, %v; want an error", wrote, err)
			}
			assertOnlyFiles(t, dir)
		})
	}
}

// TestWriteConfIdempotent: an unchanged file is not rewritten (same inode
// and mtime), a changed one is.
func TestWriteConfIdempotent(t *testing.T) {
	dir := t.TempDir()
	path := ConfPath(dir, "dcos")
	if wrote, err := WriteConf(dir, Conflist{Overlay: "dcos", MTU: 1420}); err != nil || !wrote {
		t.Fatalf("first write = %v, %v", wrote, err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	if wrote, err := WriteConf(dir, Conflist{Overlay: "dcos", MTU: 1420}); err != nil || wrote {
		t.Fatalf("unchanged write = %v, %v; want false, nil", wrote, err)
	}
	after, _ := os.Stat(path)
	if !after.ModTime().Equal(old) || !os.SameFile(before, after) {
		t.Errorf("unchanged content was rewritten")
	}
	if wrote, err := WriteConf(dir, Conflist{Overlay: "dcos", MTU: 1380}); err != nil || !wrote {
		t.Fatalf("changed write = %v, %v; want true, nil", wrote, err)
	}
	assertOnlyFiles(t, dir, "dcos.conf")
}

// TestWriteConfAtomic has readers load the file while it is rewritten:
// every read sees one complete version, and libcni lists only the file.
func TestWriteConfAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mesos") // created by the write
	if _, err := WriteConf(dir, Conflist{Overlay: "dcos", MTU: 1420}); err != nil {
		t.Fatal(err)
	}
	versions := map[string]bool{}
	for _, mtu := range []int{1420, 1421} {
		b, err := Conflist{Overlay: "dcos", MTU: mtu}.ConfBytes()
		if err != nil {
			t.Fatal(err)
		}
		versions[string(b)] = true
	}
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for range 3 {
		wg.Go(func() {
			for !stop.Load() {
				reads.Add(1)
				data, err := os.ReadFile(ConfPath(dir, "dcos"))
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
		})
	}
	deadline := time.Now().Add(testutil.WaitLimit)
	for i := 0; i < 300 || reads.Load() < 300 && len(errs) == 0 && time.Now().Before(deadline); i++ {
		if _, err := WriteConf(dir, Conflist{Overlay: "dcos", MTU: 1420 + i%2}); err != nil {
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
	assertOnlyFiles(t, dir, "dcos.conf")
}

// TestPruneConfs removes carve's .conf files of overlays gone and crash
// leftovers, and nothing else: not conflists (PruneConflists' business),
// not other files.
func TestPruneConfs(t *testing.T) {
	dir := t.TempDir()
	for _, ov := range []string{"a", "b", "c"} {
		if _, err := WriteConf(dir, Conflist{Overlay: ov, MTU: 1420}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := WriteConflist(dir, Conflist{Overlay: "b", MTU: 1420}); err != nil {
		t.Fatal(err)
	}
	foreign := []byte(`{"cniVersion":"0.3.1","name":"f","type":"bridge","ipam":{"type":"host-local"}}`)
	for name, data := range map[string][]byte{
		"foreign.conf":        foreign,
		".b.conf.tmp-123456":  []byte("{"), // a crash's leftover
		".x.conflist.tmp-123": []byte("{"), // the conflist writer's: not this prune's
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := PruneConfs(dir, []string{"a", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ConfPath(dir, "b")}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	assertOnlyFiles(t, dir, "a.conf", "c.conf", "b.conflist", "foreign.conf", ".x.conflist.tmp-123")

	if removed, err := RemoveConf(dir, "a"); err != nil || !removed {
		t.Errorf("RemoveConf(a) = %v, %v", removed, err)
	}
	if removed, err := RemoveConf(dir, "foreign"); err != nil || removed {
		t.Errorf("RemoveConf(foreign) = %v, %v; want false: not carve's", removed, err)
	}
	if _, err := RemoveConf(dir, "../x"); err == nil {
		t.Error("RemoveConf accepted an invalid overlay name")
	}
	if removed, err := PruneConfs(filepath.Join(dir, "missing"), nil); err != nil || removed != nil {
		t.Errorf("PruneConfs(missing dir) = %v, %v", removed, err)
	}
}
