package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallDisk mounts a tmpfs of size (as mount(8) takes it: "16m") on dir,
// made if missing, for a test that fills a disk; it is unmounted (lazily:
// a process may still hold files there) when the test ends. Needs root.
func SmallDisk(t testing.TB, dir, size string) *Disk {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("carve-test-disk", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return &Disk{Dir: dir}
}

// Disk is a small file system a test mounted (SmallDisk).
type Disk struct{ Dir string }

// Fill writes a file until the file system has no space left, and returns
// its path (remove it to free the space).
func (d *Disk) Fill(t testing.TB) string {
	t.Helper()
	path := filepath.Join(d.Dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	// What a partial page left, 512 bytes at a time: nothing more fits.
	for {
		if _, err := f.Write(buf[:512]); err != nil {
			break
		}
	}
	return path
}
