package api

import (
	"regexp"
	"strings"
	"testing"
)

// CanonicalSerial accepts hex in any case, with colons or 0x, and writes
// it one way; anything else is refused naming the input.
func TestCanonicalSerial(t *testing.T) {
	tests := []struct{ in, want, mention string }{
		{"0A:1B:FF", "a1bff", ""},
		{"0x00ff", "ff", ""},
		{"000", "0", ""},
		{"7c1d2e", "7c1d2e", ""},
		{"", "", `serial ""`},
		{"g1", "", `serial "g1"`},
		{"-1", "", `serial "-1"`},
		{strings.Repeat("a", 41), "", "at most 40 digits"},
	}
	for _, tt := range tests {
		got, err := CanonicalSerial(tt.in)
		if tt.mention != "" {
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("CanonicalSerial(%q) = %q, %v; want an error with %q", tt.in, got, err, tt.mention)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("CanonicalSerial(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

var canonical = regexp.MustCompile(`^(0|[1-9a-f][0-9a-f]{0,39})$`)

// FuzzCanonicalSerial: a serial from a request never panics the parser;
// what it accepts is canonical and stays the same when parsed again.
func FuzzCanonicalSerial(f *testing.F) {
	for _, s := range []string{"0A:1B:FF", "0x00ff", "0", "", "::", "0x", "ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff:ff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := CanonicalSerial(s)
		if err != nil {
			return
		}
		if !canonical.MatchString(got) {
			t.Fatalf("CanonicalSerial(%q) = %q, not canonical", s, got)
		}
		if again, err := CanonicalSerial(got); err != nil || again != got {
			t.Fatalf("CanonicalSerial(%q) = %q, %v; want %q again", got, again, err, got)
		}
	})
}
