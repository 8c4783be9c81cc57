package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestWrite writes over what is there, and WriteNew refuses to: each case
// leaves the file's contents and mode as wanted and no temporary file.
func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing []byte // nil: no file before
		write    func(path string, data []byte, mode os.FileMode) error
		want     []byte
		wantMode os.FileMode
		wantErr  error
	}{
		{name: "write a new file", write: Write, want: []byte("new"), wantMode: 0o600},
		{name: "write over a file", existing: []byte("old"), write: Write, want: []byte("new"), wantMode: 0o600},
		{name: "write new", write: WriteNew, want: []byte("new"), wantMode: 0o600},
		{name: "write new over a file", existing: []byte("old"), write: WriteNew, want: []byte("old"), wantMode: 0o644, wantErr: os.ErrExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if tc.existing != nil {
				if err := Write(path, tc.existing, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := tc.write(path, []byte("new"), 0o600)
			if !errors.Is(err, tc.wantErr) || (err != nil) != (tc.wantErr != nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(tc.want) {
				t.Errorf("contents %q, want %q", got, tc.want)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tc.wantMode {
				t.Errorf("mode %#o, want %#o", fi.Mode().Perm(), tc.wantMode)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 {
				t.Errorf("%d files in the directory, want only f: a temporary file was left", len(entries))
			}
		})
	}
}

// TestRemove removes a file, and a file already gone is no error.
func TestRemove(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := Write(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there: %v", path, err)
	}
}
