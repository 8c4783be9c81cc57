package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/carve-net/carve/api/apiclient"
)

// CheckConfig runs the checks New runs before it touches anything (no
// data dir opened, no socket, no connection): the flags' values, the CNI
// settings, the TLS files and certificate, the mesh password and the
// masters' URLs; and, beyond New, that --ip is an IP of the certificate
// (the masters refuse a registration from another). carve agent
// --check-config calls it.
func CheckConfig(cfg Config) error {
	if cfg.DataDir == "" {
		return errors.New("agent: --data-dir is required")
	}
	if err := checkCNIConfig(cfg); err != nil {
		return err
	}
	sec, err := checkSecurity(cfg)
	if err != nil {
		return err
	}
	if err := checkCertificateIP(cfg, sec); err != nil {
		return err
	}
	if _, err := apiclient.NewClient(cfg.Masters, sec.httpClient(cfg)); err != nil {
		return fmt.Errorf("agent: --masters: %w", err)
	}
	return nil
}

// checkCertificateIP refuses an --ip the agent certificate does not name:
// the masters refuse a registration from an IP its certificate lacks (403),
// so --check-config says so before the agent starts.
func checkCertificateIP(cfg Config, sec *security) error {
	if sec.files == nil || !cfg.IP.IsValid() {
		return nil
	}
	if ips := sec.files.IPs(); !slices.Contains(ips, cfg.IP.Unmap()) {
		return fmt.Errorf("agent: --ip %s is not an IP of --cert-file %s (it names %v): the masters would refuse its registration; issue a certificate with carve certs issue --role agent --name %s --ip %s, or give the IP it names",
			cfg.IP, cfg.TLS.Cert, ips, sec.id, cfg.IP)
	}
	return nil
}
