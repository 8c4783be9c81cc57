package agent

// Rotation of what an agent holds without a restart: its TLS files (the CA
// bundle, its certificate and key) and its mesh passwords.

import (
	"errors"
	"fmt"

	"github.com/carve-net/carve/api"
)

// ReloadTLS reads the CA bundle, the certificate and the key again
// (SIGHUP): new connections to the masters and to the agent's API use
// them; idle ones to the masters are closed, busy ones stay until they
// close, and a registration waiting for the operator's fix tries again. A file that fails to load, or a
// certificate that does not verify against the bundle or names another
// agent, is refused and what was loaded stays. Without TLS it does nothing.
func (a *Agent) ReloadTLS() error {
	if a.sec.files == nil {
		return nil
	}
	if err := a.sec.files.Reload(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.sec.reloaded()
	a.log.Info("reloaded the TLS files", "cert_not_after", a.sec.files.NotAfter())
	return nil
}

// errNoPasswordChange: the agent's router cannot change its mesh password
// (a test's in-process gossip).
var errNoPasswordChange = errors.New("agent: this gossip router has no mesh password to change")

// SetMeshPasswords replaces the mesh password the agent sends with, and
// those it accepts besides, for mesh connections made from now on; those
// up stay up (docs/security.md, "Rotation": three rounds over every agent,
// so gossip never splits). The agent reports the new passwords'
// fingerprints to the masters at once (carve certs check-mesh).
func (a *Agent) SetMeshPasswords(password []byte, accepted [][]byte) error {
	r, ok := a.router.(interface {
		SetPasswords([]byte, [][]byte) error
	})
	if !ok {
		return errNoPasswordChange
	}
	if err := r.SetPasswords(password, accepted); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	sent, acc := meshFingerprints(password, accepted)
	a.reports.SetMesh(sent, acc)
	a.log.Info("mesh passwords replaced for new connections", "accepted_besides", len(accepted),
		"password_fingerprint", sent, "accepted_fingerprint", acc)
	return nil
}

// meshFingerprints are the fingerprints the agent reports of its mesh
// passwords (api.ReportRequest.MeshPassword, MeshAccepted): of the one it
// sends with, and of the first it accepts besides ("" for none).
func meshFingerprints(password []byte, accepted [][]byte) (sent, acc string) {
	sent = api.MeshPasswordFingerprint(password)
	for _, p := range accepted {
		if acc = api.MeshPasswordFingerprint(p); acc != "" {
			break
		}
	}
	return sent, acc
}
