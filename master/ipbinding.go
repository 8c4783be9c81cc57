package master

import (
	"crypto/x509"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/pki"
)

// refusedWrongIP is the carve_master_auth_refusals_total reason of a
// registration whose underlay IP the agent's certificate does not name.
const refusedWrongIP = "wrong_ip"

// registeredIPAllowed checks that an agent registers an underlay IP its own
// certificate names (its IP SANs): an agent certificate holder may not
// take another host's IP. It answers 403 naming both and the fix, and
// returns false then. A registration a master forwards was checked by
// that master, which held the agent's certificate; an IP that does not
// parse goes on to the handler's 400.
func (s *server) registeredIPAllowed(w http.ResponseWriter, r *http.Request, id pki.Identity, req api.RegisterRequest) bool {
	leaf := directAgentCertificate(r)
	if leaf == nil {
		return true
	}
	ip, err := netip.ParseAddr(req.IP)
	if err != nil {
		return true
	}
	if msg := ipNotInCertificate(id.Name, ip.Unmap(), leaf); msg != "" {
		s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedWrongIP, msg)
		return false
	}
	return true
}

// directAgentCertificate is the agent certificate the request's own
// connection presented; nil when the connection is a master's (a forwarded
// request) or has none.
func directAgentCertificate(r *http.Request) *x509.Certificate {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := r.TLS.VerifiedChains[0][0]
	if id, err := pki.IdentityOf(leaf); err != nil || id.Role != pki.RoleAgent {
		return nil
	}
	return leaf
}

// ipNotInCertificate says why agent may not register ip with leaf, or ""
// when leaf names ip.
func ipNotInCertificate(agent string, ip netip.Addr, leaf *x509.Certificate) string {
	var names []string
	for _, b := range leaf.IPAddresses {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			continue
		}
		if a.Unmap() == ip {
			return ""
		}
		names = append(names, a.Unmap().String())
	}
	named := "no IP"
	if len(names) > 0 {
		named = "only " + strings.Join(names, ", ")
	}
	return fmt.Sprintf("agent %q may not register ip %s: its certificate names %s; an agent registers only an underlay IP its certificate names (if the host's IP changed, issue it a new certificate: carve certs issue --role agent --name %s --ip %s)",
		agent, ip, named, agent, ip)
}
