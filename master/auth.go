package master

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// Who may do what, from the client certificate (all in this file):
//
//   - master and operator: everything.
//   - agent: register or update its own record only (agent_id equal to
//     the certificate's name, ip and mesh_addr's host among its IP SANs:
//     ipbinding.go; a WireGuard key with a proof that it holds the
//     private half: wgproof.go); report its own configuration result
//     (PUT /overlay-master/agents/{id}/report with its own id); grow,
//     return, report grants for and report the usage of its own agent id
//     only (the {id} of the path; a grant report also needs the agent to
//     be the donor or the recipient); read the state (plain and blocking,
//     not consistent=true, which costs the leader a round of heartbeats)
//     and its changes (the long poll and the stream); read one agent's record; read /cluster/status.
//   - no certificate, or one without a carve role: 401, except /healthz and
//     /metrics, which stay open for load balancers and scrapers: they show
//     aggregate numbers only (counts, Raft role and indexes), no record.
//
// A certificate of another CA fails the TLS handshake before any of this.

// identityHeader carries, on a request a follower forwards to the leader,
// the identity of the client that sent it to the follower. The leader
// believes it only on a connection whose own certificate is a master's, so
// that an agent gains nothing by going through a follower.
const identityHeader = "X-Carve-Client-Identity"

// serialHeader carries, beside identityHeader, the serial of the original
// client's certificate: the leader checks it against its own deny list,
// since the follower that forwarded may not have applied a revocation the
// leader has already committed.
const serialHeader = "X-Carve-Client-Serial"

// Reasons of carve_master_auth_refusals_total.
const (
	refusedNoCertificate = "no_certificate"
	refusedRole          = "forbidden_role"
	refusedWrongAgent    = "wrong_agent"
)

type identityKey struct{}

// requestIdentity is the identity a request acts as, and false when the
// master runs --insecure or the path needs none.
func requestIdentity(r *http.Request) (pki.Identity, bool) {
	id, ok := r.Context().Value(identityKey{}).(pki.Identity)
	return id, ok
}

// openPath tells whether a path is served without a certificate.
func openPath(path string) bool { return path == "/healthz" || path == "/metrics" }

// authenticate establishes who sent a request, before routing: without a
// verified certificate that carries a carve role, the answer is 401.
func (s *server) authenticate(next http.Handler) http.Handler {
	if s.m.security == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		id, err := clientIdentity(r)
		if err != nil {
			s.refuse(w, r, http.StatusUnauthorized, api.CodeUnauthenticated, refusedNoCertificate, err.Error())
			return
		}
		if why := s.revokedClient(r); why != "" {
			// The connection carries the revoked certificate for as long as
			// it lives: closed, so that the holder's next request presents
			// whatever certificate it holds then (a new one, reloaded).
			w.Header().Set("Connection", "close")
			s.refuse(w, r, http.StatusUnauthorized, api.CodeRevoked, refusedRevoked, why)
			return
		}
		if fwd := r.Header.Get(identityHeader); fwd != "" && id.Role == pki.RoleMaster {
			orig, err := parseIdentity(fwd)
			if err != nil {
				httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("%s from master %s: %v", identityHeader, id.Name, err))
				return
			}
			if why := s.revokedSerial(r.Header.Get(serialHeader), orig.String()); why != "" {
				s.refuse(w, r, http.StatusUnauthorized, api.CodeRevoked, refusedRevoked, why)
				return
			}
			id = orig
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// clientIdentity is the identity of the request's verified client
// certificate; the error says what is missing.
func clientIdentity(r *http.Request) (pki.Identity, error) {
	leaf := clientLeaf(r)
	if leaf == nil {
		return pki.Identity{}, fmt.Errorf("no client certificate: %s %s needs a certificate of the cluster CA with a carve role (--cert-file and --key-file; carve certs issue makes one)", r.Method, r.URL.Path)
	}
	id, err := pki.IdentityOf(leaf)
	if err != nil {
		return pki.Identity{}, fmt.Errorf("client certificate %q carries no carve role (a carve://ROLE/NAME URI): issue one with carve certs issue", leaf.Subject.CommonName)
	}
	return id, nil
}

// parseIdentity reads identityHeader's value, Identity.String's form.
func parseIdentity(s string) (pki.Identity, error) {
	role, name, ok := strings.Cut(s, "/")
	if !ok {
		return pki.Identity{}, fmt.Errorf("%q: want role/name", s)
	}
	r, err := pki.ParseRole(role)
	if err != nil {
		return pki.Identity{}, err
	}
	if err := api.ValidateAgentID(name); err != nil {
		return pki.Identity{}, fmt.Errorf("name: %w", err)
	}
	return pki.Identity{Role: r, Name: name}, nil
}

// authorize checks a routed request against the role of its identity
// (a mux middleware: it knows the route).
func (s *server) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := requestIdentity(r)
		if !ok || id.Role == pki.RoleMaster || id.Role == pki.RoleOperator {
			next.ServeHTTP(w, r)
			return
		}
		route := r.URL.Path
		if cur := mux.CurrentRoute(r); cur != nil {
			if tpl, err := cur.GetPathTemplate(); err == nil {
				route = tpl
			}
		}
		switch r.Method + " " + route {
		case "GET /overlay-master/agents/{id}", "GET /overlay-master/changes", "GET " + api.StreamPath, "GET /cluster/status", "GET /healthz", "GET /metrics":
		case "GET /overlay-master/state":
			if c, err := strconv.ParseBool(r.URL.Query().Get("consistent")); err == nil && c {
				s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedRole,
					fmt.Sprintf("role %s may not GET /overlay-master/state?consistent=true: needs an operator or master certificate (agents read the plain or blocking state)", id.Role))
				return
			}
		case "POST /overlay-master/agents":
			if !s.ownRegistration(w, r, id) {
				return
			}
		case "PUT /overlay-master/agents/{id}/report", "POST /overlay-master/agents/{id}/blocks", "POST /overlay-master/agents/{id}/blocks/return",
			"POST /overlay-master/agents/{id}/blocks/grants", "PUT /overlay-master/agents/{id}/usage":
			if target := mux.Vars(r)["id"]; target != id.Name {
				s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedWrongAgent,
					fmt.Sprintf("role agent may not %s %s for agent %q: the certificate of agent %q acts only for itself", r.Method, route, target, id.Name))
				return
			}
		default:
			s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedRole,
				fmt.Sprintf("role %s may not %s %s: needs an operator or master certificate", id.Role, r.Method, route))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ownRegistration lets an agent register only the agent id its certificate
// names. It reads the body (and puts it back for the handler), decoding it
// as the handler does, so that both see the same agent_id; a body the
// handler will refuse anyway goes on to get its 400.
func (s *server) ownRegistration(w http.ResponseWriter, r *http.Request, id pki.Identity) bool {
	body, ok := httpapi.ReadBody(w, r)
	if !ok {
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req api.RegisterRequest
	if json.Unmarshal(body, &req) != nil {
		return true
	}
	if req.AgentID != id.Name {
		s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedWrongAgent,
			fmt.Sprintf("role agent may not register agent_id %q: the certificate of agent %q registers only agent_id %q", req.AgentID, id.Name, id.Name))
		return false
	}
	return s.registeredAddrsAllowed(w, r, id, req) && s.wireGuardKeyProven(w, r, id, req)
}

// refuse answers a refusal and counts it.
func (s *server) refuse(w http.ResponseWriter, r *http.Request, status int, code, reason, msg string) {
	s.m.metrics.authRefusals.WithLabelValues(reason).Inc()
	s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", reason, "err", msg)
	httpapi.WriteError(w, status, code, msg)
}
