package master

import (
	"crypto/ed25519"
	"fmt"
	"net/http"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// refusedWireGuardProof is the carve_master_auth_refusals_total reason of
// a registration whose WireGuard key comes without a proof of possession
// that verifies.
const refusedWireGuardProof = "wireguard_proof"

// wireGuardKeyProven checks that an agent that registers a WireGuard key
// holds its private half (api/wgproof.go): a host that registered another
// host's key took that host's traffic from every peer (issue 26). It
// checks, with this master's signing key, the proof made against that
// key, and answers 403 CodeWireGuardProof naming the problem, the fix and
// its key (api.Error.SigningKey) otherwise; malformed proofs get 400.
//
// An agent of an earlier release sends no proof: it may register again
// the key its record already carries (at this master), so that a rolling
// upgrade keeps every agent registered; a new or changed key takes a
// proof. A registration a master forwards was checked by that master,
// which held the agent's certificate; operators and masters register
// what they like (they may do everything).
func (s *server) wireGuardKeyProven(w http.ResponseWriter, r *http.Request, id pki.Identity, req api.RegisterRequest) bool {
	if req.Keys.WireGuard == "" || directAgentCertificate(r) == nil {
		return true
	}
	kp := s.m.signingKey.Load()
	if kp == nil || len(*kp) != ed25519.PrivateKeySize {
		return true // no signing key (--insecure): no certificates either
	}
	key := *kp
	own := api.EncodeSigningKey(key.Public().(ed25519.PublicKey))
	ownPrint := api.SigningKeyFingerprint(key.Public().(ed25519.PublicKey))
	if err := api.ValidateWireGuardProofs(req.WireGuardProofs); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return false
	}
	var against []string
	for _, p := range req.WireGuardProofs {
		if p.SigningKey != own {
			if pub, err := api.ParseSigningKey(p.SigningKey); err == nil {
				against = append(against, api.SigningKeyFingerprint(pub))
			}
			continue
		}
		if err := api.VerifyWireGuardProof(key, id.Name, req.Keys.WireGuard, p); err != nil {
			s.refuseProof(w, r, own, fmt.Sprintf("agent %q may not register wireguard key %s: %v; an agent registers only a WireGuard key whose private half it holds (its --data-dir's wireguard.key), never another host's",
				id.Name, req.Keys.WireGuard, err))
			return false
		}
		return true
	}
	if len(against) > 0 {
		s.refuseProof(w, r, own, fmt.Sprintf("agent %q registers wireguard key %s with proofs of possession against signing keys %s, and this master signs with key %s (signing_key): make the proof against that key and register again (an agent of this release does so by itself)",
			id.Name, req.Keys.WireGuard, strings.Join(against, ", "), ownPrint))
		return false
	}
	if rec, ok := s.m.table.Agent(id.Name); ok && rec.Keys.WireGuard == req.Keys.WireGuard {
		return true // an agent of an earlier release registers its own key again
	}
	s.refuseProof(w, r, own, fmt.Sprintf("agent %q registers wireguard key %s without a proof of possession (wireguard_proofs): the masters sign a new or changed WireGuard key only with a proof that the agent holds its private half; upgrade the agent to the masters' carve version, whose agents send one",
		id.Name, req.Keys.WireGuard))
	return false
}

// refuseProof answers 403 CodeWireGuardProof with this master's signing
// key, and counts it.
func (s *server) refuseProof(w http.ResponseWriter, r *http.Request, signingKey, msg string) {
	s.m.metrics.authRefusals.WithLabelValues(refusedWireGuardProof).Inc()
	s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", refusedWireGuardProof, "err", msg)
	httpapi.WriteJSON(w, http.StatusForbidden, api.Error{Message: msg, Code: api.CodeWireGuardProof, SigningKey: signingKey})
}
