// Package atomicfile puts a file in place whole or not at all, durably:
// written through a temporary file in the same directory, fsynced, moved
// into place (renamed over the target, or linked where no file may be
// replaced), and the directory fsynced after the move, so that after a
// power loss the file is there with its contents, or not there at all.
// Every file of the shipped tree that matters is written through it
// (tree_test.go keeps it so).
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Write writes data to path with mode, replacing what path held. The
// temporary file's name starts with a dot and ends in ".tmp-" and random
// digits, so that no reader of the directory that looks for an extension
// (CNI runtimes: .conf, .conflist, .json) loads it.
func Write(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, os.Rename)
}

// WriteNew is Write refusing to replace a file: when path exists it
// changes nothing and the error wraps os.ErrExist.
func WriteNew(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, func(tmp, path string) error {
		// A hard link fails on an existing target, as rename does not;
		// the temporary name is removed below either way.
		err := os.Link(tmp, path)
		if rerr := os.Remove(tmp); err == nil && rerr != nil {
			err = rerr
		}
		return err
	})
}

func write(path string, data []byte, mode os.FileMode, place func(tmp, path string) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = place(tmp.Name(), path); err != nil {
		return fmt.Errorf("move into place %s: %w", path, err)
	}
	return SyncDir(dir)
}

// Remove removes path and fsyncs its directory, so that the removal
// survives a power loss. A path already gone is no error.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove: %w", err)
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes a rename or removal in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
