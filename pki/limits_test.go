package pki

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Issue and CreateCA refuse validities beyond the maxima, naming them, and
// an agent certificate without an IP.
func TestIssueLimits(t *testing.T) {
	dir := newCA(t)
	ip := []netip.Addr{netip.MustParseAddr("198.18.0.7")}
	day := 24 * time.Hour
	tests := []struct {
		name    string
		req     IssueRequest
		want    error
		mention string
	}{
		{"agent without ip", IssueRequest{Role: RoleAgent, Name: "h7"}, ErrAgentNeedsIP, "--ip"},
		{"100000 days", IssueRequest{Role: RoleOperator, Name: "bob", Validity: 100000 * day}, ErrValidity, "at most 825 days"},
		{"the maximum", IssueRequest{Role: RoleAgent, Name: "h8", IPs: ip, Validity: MaxCertDays * day}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Issue(dir, tt.req)
			if !errors.Is(err, tt.want) || (tt.want != nil && !strings.Contains(err.Error(), tt.mention)) {
				t.Fatalf("Issue: %v; want %v mentioning %q", err, tt.want, tt.mention)
			}
		})
	}
	if err := CreateCA(t.TempDir(), (MaxCADays+1)*day); !errors.Is(err, ErrValidity) || !strings.Contains(err.Error(), "at most 7300 days") {
		t.Fatalf("CreateCA beyond the maximum: %v", err)
	}
}
