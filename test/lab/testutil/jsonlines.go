package testutil

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// JSONLines reads a file of one JSON value a line, such as the log a
// test's spy (a stand-in plugin, a helper process) appends a call to: a
// missing file holds none, a line that does not decode as a T fails the
// test.
func JSONLines[T any](t testing.TB, path string) []T {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []T
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l == "" {
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%s: line %q: %v", path, l, err)
		}
		out = append(out, v)
	}
	return out
}
