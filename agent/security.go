package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// errNotAMaster: the server at a master URL showed a certificate of the
// cluster CA whose role is not master.
var errNotAMaster = errors.New("not a master's certificate")

// ErrInsecure is what New refuses with when a security setting is missing
// and Config.Insecure does not allow it.
var ErrInsecure = errors.New("refusing to run insecure")

// security is what an agent's configuration says about its channels.
type security struct {
	// client talks to the masters (nil: plain http); server serves the
	// agent's HTTP API (nil: plain http, no client certificates).
	client, server *tls.Config
	// id is the agent id: the certificate's name, or Config.ID; idFrom says
	// where it comes from, for errors.
	id, idFrom string
	// insecure lists what runs without protection (--insecure allowed it).
	insecure []string
	// files are the TLS files as last loaded (SIGHUP reloads them); nil
	// without TLS.
	files *pki.Reloader
	// transport is the masters' client transport (nil: plain http), whose
	// idle connections, made with the files as they were, a reload closes.
	transport *http.Transport
	// reload wakes those waiting for the operator to fix the TLS files.
	reload reloadSignal
}

// reloadSignal is a broadcast: each fire wakes every waiter of before it.
type reloadSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next fire.
func (s *reloadSignal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// fire wakes every waiter.
func (s *reloadSignal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// reloaded follows a reload of the TLS files: connections made with the
// old ones and idle now are closed, and whoever waits for a fix (a
// registration the masters refused the certificate of) tries at once.
func (sec *security) reloaded() {
	if sec.transport != nil {
		sec.transport.CloseIdleConnections()
	}
	sec.reload.fire()
}

// sleepUntilReload waits d, or less when the TLS files are reloaded; false
// when ctx ends.
func (sec *security) sleepUntilReload(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-sec.reload.wait():
	}
	return true
}

// checkSecurity reads the TLS files and checks the configuration: TLS and a
// mesh password unless Insecure, an agent certificate naming the agent's id.
func checkSecurity(cfg Config) (*security, error) {
	sec := &security{id: cfg.ID, idFrom: "--id"}
	if secure := httpsMasters(cfg.Masters); len(secure) > 0 && !cfg.TLS.Enabled() {
		return nil, fmt.Errorf("agent: --masters %s is https, but no TLS credentials are given: give --ca-file (the cluster CA), --cert-file and --key-file (an agent certificate: carve certs issue --role agent --name AGENT_ID --ip UNDERLAY_IP)", strings.Join(secure, ","))
	}
	if !cfg.TLS.Enabled() {
		if !cfg.Insecure {
			return nil, fmt.Errorf("%w: no TLS credentials: give --ca-file, --cert-file and --key-file (an agent certificate: carve certs issue --role agent --name AGENT_ID --ip UNDERLAY_IP), or --insecure for a throwaway lab", ErrInsecure)
		}
		sec.insecure = append(sec.insecure, "TLS (its HTTP API is plain http and open to anyone who reaches it)")
	} else {
		if err := cfg.TLS.Check(true); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		files, err := pki.NewReloader(cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		sec.files = files
		id := files.Identity()
		if id.Role != pki.RoleAgent {
			return nil, fmt.Errorf("agent: --cert-file %s is the certificate of %s (role %s), not an agent's: issue one with carve certs issue --role agent --name AGENT_ID --ip UNDERLAY_IP", cfg.TLS.Cert, id, id.Role)
		}
		if cfg.ID != "" && cfg.ID != id.Name {
			return nil, fmt.Errorf("agent: --id %q differs from the agent id %q that --cert-file %s names: drop --id, or use the certificate issued for %q", cfg.ID, id.Name, cfg.TLS.Cert, cfg.ID)
		}
		sec.id, sec.idFrom = id.Name, fmt.Sprintf("the agent id of --cert-file %s", cfg.TLS.Cert)
		sec.server, sec.client = files.ServerConfig(false), files.ClientConfig()
		// Any certificate of the CA verifies; only a master's may answer as
		// one (an agent's certificate names its own IP, but still).
		masterOnly := pki.RequireRole(pki.RoleMaster)
		sec.client.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := masterOnly(cs); err != nil {
				return fmt.Errorf("%w: %w", errNotAMaster, err)
			}
			return nil
		}
	}
	if cfg.MeshPassword == nil {
		if !cfg.Insecure {
			return nil, fmt.Errorf("%w: no mesh password: give --mesh-password-file (the same secret on every agent), or --insecure for a throwaway lab", ErrInsecure)
		}
		sec.insecure = append(sec.insecure, "a mesh password (gossip is unauthenticated and in clear)")
	}
	if err := sec.checkMasters(cfg); err != nil {
		return nil, err
	}
	return sec, nil
}

// checkMasters compares the master URLs' scheme with the TLS files, so that
// a mismatch is named at start instead of failing every request.
func (sec *security) checkMasters(cfg Config) error {
	secure := httpsMasters(cfg.Masters)
	var plain []string
	for _, m := range cfg.Masters {
		if m = strings.TrimSpace(m); m != "" && !slices.Contains(secure, m) {
			plain = append(plain, m) // no scheme means http (apiclient.NewClient)
		}
	}
	switch {
	case len(plain) > 0 && len(secure) > 0:
		return fmt.Errorf("agent: --masters mixes https (%s) and http (%s): the masters serve one or the other", strings.Join(secure, ","), strings.Join(plain, ","))
	case len(plain) > 0 && sec.client != nil && !cfg.Insecure:
		return fmt.Errorf("%w: --masters %s is plain http, but TLS files are given: masters with TLS serve https (use https://HOST:PORT), and plain http masters need --insecure", ErrInsecure, strings.Join(plain, ","))
	case len(plain) > 0 && sec.client != nil:
		sec.client = nil
		sec.insecure = append(sec.insecure, "TLS towards the masters (plain http)")
	}
	return nil
}

// httpsMasters are the master URLs with the https scheme.
func httpsMasters(masters []string) []string {
	var out []string
	for _, m := range masters {
		m = strings.TrimSpace(m)
		if u, err := url.Parse(m); err == nil && u.Scheme == "https" {
			out = append(out, m)
		}
	}
	return out
}

// httpClient is the agent's client of the masters.
func (sec *security) httpClient(cfg Config) *http.Client {
	hc := &http.Client{Timeout: cfg.WatchWait + 15*time.Second}
	if sec.client != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = sec.client
		// Each new connection with the TLS files as last loaded.
		tr.DialTLSContext = sec.files.DialTLS(sec.client, tr.TLSHandshakeTimeout, nil)
		hc.Transport = tr
		sec.transport = tr
	}
	return hc
}

// requireClientCert answers 401 to requests without a verified client
// certificate of the cluster CA, on every route but /healthz (load
// balancers and supervisors probe it without credentials). /metrics is not
// an exception, as on the masters: a scraper presents a certificate.
func (a *Agent) requireClientCert(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		if _, ok := pki.PeerIdentity(r); !ok {
			a.metrics.httpRefused.WithLabelValues("no_certificate").Inc()
			httpapi.WriteError(w, http.StatusUnauthorized, api.CodeUnauthenticated,
				"a client certificate of the cluster CA is required (every route but /healthz): give curl --cacert CA --cert CERT --key KEY")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// explainMasterError says what a failure to talk to the masters means when
// it is a TLS or scheme mismatch, which retrying never fixes; "" otherwise
// (and for no error).
func explainMasterError(err error, tlsFiles pki.Files) string {
	if err == nil {
		return ""
	}
	var (
		unknownCA  x509.UnknownAuthorityError
		hostname   x509.HostnameError
		verify     *tls.CertificateVerificationError
		record     tls.RecordHeaderError
		opErr      *net.OpError
		apiErr     *api.Error
		invalidErr x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, errNotAMaster):
		return "TLS: the server at --masters is not a master: its certificate, of the cluster CA, carries another role"
	case errors.As(err, &hostname):
		return fmt.Sprintf("TLS: the master's certificate is not valid for %s: issue the master certificates with the address in --masters (carve certs issue --role master --ip IP)", hostname.Host)
	case errors.As(err, &unknownCA):
		return fmt.Sprintf("TLS: the master's certificate does not verify against --ca-file %s: it was issued by another CA (another cluster's?)", tlsFiles.CA)
	case errors.As(err, &invalidErr):
		return fmt.Sprintf("TLS: the master's certificate is invalid: %v", invalidErr)
	case errors.As(err, &verify):
		return fmt.Sprintf("TLS: the master's certificate is refused: %v", verify.Err)
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		// The master's alert: it refused the certificate this agent gave.
		return fmt.Sprintf("TLS: the master refused this agent's certificate (%v): --cert-file %s is not of the masters' CA, or has expired", opErr.Err, tlsFiles.Cert)
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return "TLS: the master does not speak TLS: it serves plain http (give --masters http://... and --insecure, or start the masters with TLS)"
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusBadRequest && strings.Contains(apiErr.Message, "HTTP request to an HTTPS server"):
		return "TLS: the masters serve https: give --masters https://HOST:PORT and --ca-file, --cert-file and --key-file"
	case errors.As(err, &apiErr) && apiErr.Code == api.CodeRevoked:
		return fmt.Sprintf("TLS: the masters revoked this agent's certificate (--cert-file %s): issue it a new one (carve certs issue --role agent --name AGENT_ID --ip UNDERLAY_IP), put it in place and reload the agent (SIGHUP): it registers again without a restart", tlsFiles.Cert)
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized:
		return "TLS: the masters require a client certificate: give --ca-file, --cert-file and --key-file"
	}
	return ""
}
