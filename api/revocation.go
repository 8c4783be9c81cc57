package api

import (
	"fmt"
	"strings"
)

// Revocation is a certificate on the masters' deny list: the masters
// refuse it on the API and on Raft, and agents drop the records of a
// revoked agent (a carve extension; see docs/security.md).
type Revocation struct {
	// Serial is the certificate's serial number, lowercase hex without
	// separators (CanonicalSerial).
	Serial string `json:"serial"`
	// Identity is the certificate's role/name ("agent/h1"), when the
	// revoker knew it.
	Identity string `json:"identity,omitempty"`
	// NotAfter is when the certificate expires (Unix seconds), when the
	// revoker knew it: the entry is dropped once it has, at the next
	// tombstone compaction.
	NotAfter int64 `json:"not_after,omitempty"`
	// Index is the Raft index of the revocation: records of a revoked
	// agent at or below it were signed while the certificate was good.
	Index uint64 `json:"index"`
}

// RevokeRequest is POST /cluster/revocations: put a certificate on the
// deny list. A revoked agent's record is deleted in the same log entry.
type RevokeRequest struct {
	Serial    string `json:"serial"`
	Identity  string `json:"identity,omitempty"`
	NotAfter  int64  `json:"not_after,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// Revocations is the answer of GET and POST /cluster/revocations: the
// whole deny list, and what the revocation deleted.
type Revocations struct {
	Revoked []Revocation `json:"revoked"`
	Deleted []string     `json:"deleted,omitempty"`
}

// serialHex tells whether h is a serial number in lowercase hex: 1 to 40
// digits, at most 20 bytes (RFC 5280). A loop, like the naming rules
// (validate.go): carve-ipam links this package and starts twice per
// container.
func serialHex(h string) bool {
	if h == "" || len(h) > 40 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// CanonicalSerial writes a hex serial number (any case, with or without
// colons or a 0x prefix) as lowercase hex without leading zeros.
func CanonicalSerial(s string) (string, error) {
	h := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"))
	h = strings.ReplaceAll(h, ":", "")
	if !serialHex(h) {
		return "", fmt.Errorf("serial %q: want the certificate's serial number in hex (at most 40 digits; openssl x509 -serial or carve certs issue prints it)", s)
	}
	if h = strings.TrimLeft(h, "0"); h == "" {
		h = "0"
	}
	return h, nil
}
