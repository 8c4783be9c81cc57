package pki

// TLS files that are read again without a restart: the CA bundle, the
// certificate and the key of a master or an agent. Every handshake uses
// the files as last loaded, so that the CA and the certificates rotate
// with no downtime (docs/security.md, "Rotation").

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// ErrIdentityChanged: a reloaded certificate names another role or name
// than the one loaded at start; it is refused (a restart may change it).
var ErrIdentityChanged = errors.New("the reloaded certificate names another identity")

// Reloader holds a component's TLS files as last loaded: the CA bundle
// (every certificate in the CA file is trusted, so that two CAs are during
// a CA rotation), and the certificate and key.
type Reloader struct {
	files Files

	mu   sync.RWMutex
	pool *x509.CertPool
	cert tls.Certificate
	id   Identity
}

// NewReloader loads the CA bundle, the certificate and the key of f.
func NewReloader(f Files) (*Reloader, error) {
	r := &Reloader{files: f}
	pool, cert, id, err := r.load(false)
	if err != nil {
		return nil, err
	}
	r.pool, r.cert, r.id = pool, cert, id
	return r, nil
}

// load reads the files; chained: and checks that the certificate verifies
// against the bundle, as on a reload: a bundle without the certificate's
// CA would lock a running component out of its cluster. (At start a
// certificate of another CA is the peers' to refuse, and to count.)
func (r *Reloader) load(chained bool) (*x509.CertPool, tls.Certificate, Identity, error) {
	if err := r.files.Check(true); err != nil {
		return nil, tls.Certificate{}, Identity{}, err
	}
	pool, err := r.files.Pool()
	if err != nil {
		return nil, tls.Certificate{}, Identity{}, err
	}
	cert, id, err := r.files.keyPair()
	if err != nil {
		return nil, tls.Certificate{}, Identity{}, err
	}
	if !chained {
		return pool, cert, id, nil
	}
	if _, err := verifyLoaded(pool, cert); err != nil {
		return nil, tls.Certificate{}, Identity{}, fmt.Errorf("--cert-file %s does not verify against --ca-file %s (during a CA rotation the CA file holds both CAs until every certificate is re-issued): %w",
			r.files.Cert, r.files.CA, err)
	}
	return pool, cert, id, nil
}

// Reload reads the files again. What fails to load, or a certificate of
// another identity, is refused, and what was loaded before stays.
func (r *Reloader) Reload() error {
	pool, cert, id, err := r.load(true)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if id != r.id {
		return fmt.Errorf("%w: --cert-file %s names %s, this process runs as %s: restart it to change identity", ErrIdentityChanged, r.files.Cert, id, r.id)
	}
	r.pool, r.cert = pool, cert
	return nil
}

// Identity is the identity of the certificate loaded.
func (r *Reloader) Identity() Identity {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.id
}

// IPs are the IP addresses the certificate loaded names.
func (r *Reloader) IPs() []netip.Addr {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []netip.Addr
	for _, ip := range r.cert.Leaf.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// IssuerKey is the SubjectPublicKeyInfo (DER) of the CA of the CA file
// loaded that issued the certificate loaded; false when it verifies
// against none (a certificate of another CA, loaded at start).
func (r *Reloader) IssuerKey() ([]byte, bool) {
	chains, err := verifyLoaded(r.current())
	if err != nil || len(chains) == 0 || len(chains[0]) < 2 {
		return nil, false
	}
	chain := chains[0]
	return chain[len(chain)-1].RawSubjectPublicKeyInfo, true
}

// NotAfter is when the certificate loaded expires.
func (r *Reloader) NotAfter() time.Time {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cert.Leaf.NotAfter
}

// verifyLoaded verifies a loaded certificate (with the intermediates it
// carries) against pool, for any use.
func verifyLoaded(pool *x509.CertPool, cert tls.Certificate) ([][]*x509.Certificate, error) {
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	return cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
}

func (r *Reloader) current() (*x509.CertPool, tls.Certificate) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.pool, r.cert
}

// ServerConfig is Files.ServerConfig with the files as last loaded at each
// handshake. The VerifyConnection set on the returned configuration (not
// on a clone of it) applies to every handshake.
func (r *Reloader) ServerConfig(requireClient bool) *tls.Config {
	auth := tls.VerifyClientCertIfGiven
	if requireClient {
		auth = tls.RequireAndVerifyClientCert
	}
	outer := &tls.Config{MinVersion: tls.VersionTLS12}
	outer.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, cert := r.current()
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
			ClientCAs: pool, ClientAuth: auth, VerifyConnection: outer.VerifyConnection}, nil
	}
	return outer
}

// ClientConfig is Files.ClientConfig with the files as loaded now; dial
// with Refresh (or DialTLS) to use the files as loaded at each handshake.
func (r *Reloader) ClientConfig() *tls.Config {
	return r.Refresh(&tls.Config{MinVersion: tls.VersionTLS12})
}

// Refresh sets cfg's roots and certificate to the files as last loaded,
// and returns it: call it on a clone, before a handshake.
func (r *Reloader) Refresh(cfg *tls.Config) *tls.Config {
	pool, cert := r.current()
	cfg.RootCAs, cfg.Certificates = pool, []tls.Certificate{cert}
	return cfg
}

// DialFunc dials a connection (net.Dialer.DialContext).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// DialTLS is an http.Transport's DialTLSContext: it dials addr with dial
// (nil: a net.Dialer) and handshakes with a clone of template refreshed
// (its ServerName, when empty, is addr's host), so that every new
// connection uses the files as last loaded.
func (r *Reloader) DialTLS(template *tls.Config, handshakeTimeout time.Duration, dial DialFunc) DialFunc {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("pki: dial %q: %w", addr, err)
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := r.Refresh(template.Clone())
		if cfg.ServerName == "" {
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		if handshakeTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, handshakeTimeout)
			defer cancel()
		}
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return tc, nil
	}
}
