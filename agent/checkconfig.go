package agent

import (
	"errors"
	"fmt"

	"github.com/carve-net/carve/api"
)

// CheckConfig runs the checks New runs before it touches anything (no
// data dir opened, no socket, no connection): the flags' values, the CNI
// settings, the TLS files and certificate, the mesh password and the
// masters' URLs. carve agent --check-config calls it.
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
	if _, err := api.NewClient(cfg.Masters, sec.httpClient(cfg)); err != nil {
		return fmt.Errorf("agent: --masters: %w", err)
	}
	return nil
}
