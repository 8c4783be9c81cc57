package enginelab

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestBusyboxLayoutsAgree writes both forms from a stand-in binary and
// checks they hold the same entries: busybox with its bytes, and every
// applet a link to it.
func TestBusyboxLayoutsAgree(t *testing.T) {
	src := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(src, []byte("not really busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	layer, err := BusyboxRootfs(src)
	if err != nil {
		t.Fatal(err)
	}
	fromTar := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			fromTar[h.Name] = "file " + string(data)
		case tar.TypeSymlink:
			fromTar[h.Name] = "link " + h.Linkname
		}
	}
	dir := filepath.Join(t.TempDir(), "root")
	if err := BusyboxRootfsDir(dir, src); err != nil {
		t.Fatal(err)
	}
	fromDir := map[string]string{}
	entries, err := os.ReadDir(filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, "bin", e.Name())
		if target, err := os.Readlink(p); err == nil {
			fromDir["bin/"+e.Name()] = "link " + target
			continue
		}
		data, _ := os.ReadFile(p)
		fromDir["bin/"+e.Name()] = "file " + string(data)
	}
	if len(fromTar) != len(busyboxApplets())+1 || fromTar["bin/busybox"] != "file not really busybox" {
		t.Fatalf("tar holds %v", fromTar)
	}
	for name, what := range fromTar {
		if fromDir[name] != what {
			t.Errorf("%s: tar has %q, directory has %q", name, what, fromDir[name])
		}
	}
	if len(fromDir) != len(fromTar) {
		t.Errorf("directory holds %d entries, tar %d", len(fromDir), len(fromTar))
	}
	if !slices.Contains(busyboxApplets(), "ping") || fromDir["bin/ping"] != "link busybox" {
		t.Errorf("no ping applet: %v", fromDir)
	}
}

// TestBusyboxLayer checks the layer of an image whose commands are not
// known in advance: every applet busybox lists (not busybox itself, nor a
// name with a slash) linked in bin/, the directories, and the files with
// their content; the same inputs give the same bytes (the same digest).
func TestBusyboxLayer(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "busybox")
	// A stand-in that answers --list as busybox does.
	if err := os.WriteFile(src, []byte("#!/bin/sh\nprintf 'busybox\\ncat\\nhttpd\\n/bad\\ntop\\n'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	applets, err := BusyboxApplets(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"cat", "httpd", "top"}; !slices.Equal(applets, want) {
		t.Fatalf("applets %v, want %v", applets, want)
	}
	files := map[string]string{"www/index.html": "hello\n", "etc/motd": "hi\n"}
	layer, err := BusyboxLayer(src, applets, []string{"etc", "www/"}, files)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			got[h.Name] = "dir"
		case tar.TypeSymlink:
			got[h.Name] = "link " + h.Linkname
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			got[h.Name] = "file " + string(data)
		}
	}
	bin, _ := os.ReadFile(src)
	want := map[string]string{
		"bin/": "dir", "etc/": "dir", "www/": "dir",
		"bin/busybox": "file " + string(bin),
		"bin/cat":     "link busybox", "bin/httpd": "link busybox", "bin/top": "link busybox",
		"www/index.html": "file hello\n", "etc/motd": "file hi\n",
	}
	if !maps.Equal(got, want) {
		t.Errorf("layer holds %v, want %v", got, want)
	}
	again, err := BusyboxLayer(src, applets, []string{"etc", "www/"}, files)
	if err != nil || !bytes.Equal(again, layer) {
		t.Errorf("a second layer of the same inputs differs (%v)", err)
	}
}
