package pki

import (
	"errors"
	"fmt"
	"time"
)

// Longest validities: a certificate that leaks stays good until it expires
// or is revoked, so none may outlive what an operator would remember to
// rotate.
const (
	// MaxCertDays bounds an issued certificate's validity (about 27 months).
	MaxCertDays = 825
	// MaxCADays bounds the cluster CA's validity (20 years).
	MaxCADays = 7300
)

// Sentinel errors of the issue-time checks.
var (
	// ErrValidity: a validity beyond MaxCertDays or MaxCADays.
	ErrValidity = errors.New("validity too long")
	// ErrAgentNeedsIP: an agent certificate without an IP address; the
	// masters accept a registration only with an IP the certificate names.
	ErrAgentNeedsIP = errors.New("an agent certificate needs its underlay IP")
)

// checkValidity refuses a validity beyond maxDays, naming the maximum.
func checkValidity(what string, validity time.Duration, maxDays int) error {
	if validity > time.Duration(maxDays)*24*time.Hour {
		return fmt.Errorf("pki: %s valid %d days: %w: at most %d days", what, int(validity/(24*time.Hour)), ErrValidity, maxDays)
	}
	return nil
}

// checkIssueRequest checks what Issue may sign: a bounded validity, and
// for an agent at least one IP (its underlay IP, which binds its
// registration).
func checkIssueRequest(req IssueRequest) error {
	if err := checkValidity("certificate", req.Validity, MaxCertDays); err != nil {
		return err
	}
	if req.Role == RoleAgent && len(req.IPs) == 0 {
		return fmt.Errorf("pki: agent %s: %w (give --ip UNDERLAY_IP: the masters refuse a registration whose IP the certificate does not name)", req.Name, ErrAgentNeedsIP)
	}
	return nil
}
