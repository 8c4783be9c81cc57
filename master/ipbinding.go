package master

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/pki"
)

// Reasons of carve_master_auth_refusals_total: a registration whose
// underlay IP, or whose mesh address's host, the agent's certificate does
// not name.
const (
	refusedWrongIP       = "wrong_ip"
	refusedWrongMeshAddr = "wrong_mesh_addr"
)

// registeredAddrsAllowed checks that an agent registers only underlay
// addresses its own certificate names (its IP SANs): its ip, and the host
// of its mesh_addr, where the other agents dial its gossip. An agent
// certificate holder may take neither another host's IP nor its mesh
// address (issue 26: a host registered another's mesh host:port and the
// masters signed it). It answers 403 naming both and the fix, and returns
// false then. A registration a master forwards was checked by that
// master, which held the agent's certificate; an ip or a mesh_addr that
// does not parse as HOST:PORT goes on to the handler's 400.
func (s *server) registeredAddrsAllowed(w http.ResponseWriter, r *http.Request, id pki.Identity, req api.RegisterRequest) bool {
	leaf := directAgentCertificate(r)
	if leaf == nil {
		return true
	}
	if ip, err := netip.ParseAddr(req.IP); err == nil {
		if msg := notInCertificate(id.Name, "ip", req.IP, ip, leaf); msg != "" {
			s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedWrongIP, msg)
			return false
		}
	}
	if msg := meshAddrNotInCertificate(id.Name, req.MeshAddr, leaf); msg != "" {
		s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedWrongMeshAddr, msg)
		return false
	}
	return true
}

// meshAddrNotInCertificate says why agent may not register meshAddr with
// leaf, or "" when leaf names its host (or it is empty, or not HOST:PORT,
// which validation refuses).
func meshAddrNotInCertificate(agent, meshAddr string, leaf *x509.Certificate) string {
	if meshAddr == "" {
		return ""
	}
	host, _, err := net.SplitHostPort(meshAddr)
	if err != nil || host == "" {
		return ""
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Sprintf("agent %q may not register mesh_addr %s: its host %q is not an IP, and an agent registers only underlay IPs its certificate names (%s); give --mesh-addr IP:PORT with one of them",
			agent, meshAddr, host, certificateIPs(leaf))
	}
	return notInCertificate(agent, "mesh_addr", meshAddr, ip.WithZone(""), leaf)
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

// notInCertificate says why agent may not register value as field (ip or
// mesh_addr), whose IP is ip, with leaf, or "" when leaf names ip.
func notInCertificate(agent, field, value string, ip netip.Addr, leaf *x509.Certificate) string {
	ip = ip.Unmap()
	for _, b := range leaf.IPAddresses {
		if a, ok := netip.AddrFromSlice(b); ok && a.Unmap() == ip {
			return ""
		}
	}
	fix := fmt.Sprintf("if the host's IP changed, issue it a new certificate: carve certs issue --role agent --name %s --ip %s", agent, ip)
	if field == "mesh_addr" {
		fix = fmt.Sprintf("give --mesh-addr an IP its certificate names, or issue it a new certificate: carve certs issue --role agent --name %s --ip %s", agent, ip)
	}
	return fmt.Sprintf("agent %q may not register %s %s: its certificate names %s; an agent registers only underlay IPs its certificate names (%s)",
		agent, field, value, certificateIPs(leaf), fix)
}

// certificateIPs names leaf's IP SANs: "only A, B" or "no IP".
func certificateIPs(leaf *x509.Certificate) string {
	var names []string
	for _, b := range leaf.IPAddresses {
		if a, ok := netip.AddrFromSlice(b); ok {
			names = append(names, a.Unmap().String())
		}
	}
	if len(names) == 0 {
		return "no IP"
	}
	return "only " + strings.Join(names, ", ")
}
