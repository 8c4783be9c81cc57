package testutil

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestJSONLines(t *testing.T) {
	type call struct{ Command, ID string }
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		want          []call
	}{
		{"missing", "", nil},
		{"empty", "\n", nil},
		{"two", "{\"Command\":\"ADD\",\"ID\":\"a\"}\n{\"Command\":\"DEL\",\"ID\":\"a\"}\n", []call{{"ADD", "a"}, {"DEL", "a"}}},
		{"no final newline", `{"Command":"ADD","ID":"b"}`, []call{{"ADD", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if tc.content != "" {
				if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := JSONLines[call](t, p); !slices.Equal(got, tc.want) {
				t.Errorf("JSONLines = %v, want %v", got, tc.want)
			}
		})
	}
}
