package master

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
)

// InsecureWarning is what a master logs at start with Options.Insecure.
const InsecureWarning = "--insecure: the API and Raft run without TLS or authentication; for a throwaway lab only"

// security is a master's TLS: what it serves, how it dials the other
// masters, and who it is.
type security struct {
	identity pki.Identity
	// http serves the API: client certificates verified when given, so a
	// request without one gets a JSON 401 rather than a failed handshake.
	http *tls.Config
	// client dials the other masters' APIs (forwarding, --join) with this
	// master's certificate, and accepts only masters.
	client *tls.Config
	// raft is the mutual TLS of the Raft transport: masters only, both ways.
	raft *raftlog.TransportTLS
	// files are the TLS files as last loaded: every handshake uses them,
	// and Reload (SIGHUP) reads them again.
	files *pki.Reloader
}

// newSecurity checks the security options and loads the TLS configurations;
// nil (and no error) with Insecure.
func newSecurity(opts Options, log *slog.Logger) (*security, error) {
	if opts.Insecure {
		if opts.TLS.Enabled() {
			return nil, errors.New("master: --insecure contradicts --ca-file/--cert-file/--key-file: give one or the other")
		}
		return nil, nil
	}
	if err := opts.TLS.Check(true); err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	files, err := pki.NewReloader(opts.TLS)
	if err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	id := files.Identity()
	if id.Role != pki.RoleMaster {
		return nil, fmt.Errorf("master: --cert-file %s is a certificate of role %s; a master needs role master (carve certs issue --role master)", opts.TLS.Cert, id.Role)
	}
	if id.Name != opts.ID {
		// Another master's certificate: the masters would take this one
		// for that one (forwarded identities, the Raft peers' names).
		return nil, fmt.Errorf("master: --cert-file %s is the certificate of master %q, and this master is --id %q: give each master its own certificate (carve certs issue --role master --name %s --ip ...), or fix --id",
			opts.TLS.Cert, id.Name, opts.ID, opts.ID)
	}
	if opts.SigningKey == nil {
		return nil, errors.New("master: --signing-key-file is required with TLS (the signing.key that carve certs ca wrote beside the CA)")
	}
	sec := &security{identity: id, raft: &raftlog.TransportTLS{Refresh: files.Refresh}, files: files}
	sec.http = files.ServerConfig(false)
	mastersOnly := pki.RequireRole(pki.RoleMaster)
	sec.client = files.ClientConfig()
	sec.client.VerifyConnection = mastersOnly
	sec.raft.Server = files.ServerConfig(true)
	sec.raft.Server.VerifyConnection = mastersOnly
	sec.raft.Client = sec.client.Clone()
	return sec, nil
}

// scheme is the scheme of this master's API URLs.
func (m *Master) scheme() string {
	if m.security == nil {
		return "http://"
	}
	return "https://"
}
