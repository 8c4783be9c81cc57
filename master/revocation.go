package master

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
)

// Revocation: POST /cluster/revocations puts a certificate on the deny
// list, a state-machine command replicated through Raft (and kept in
// snapshots); the masters then refuse the certificate on the API (401
// here) and on Raft and forwarding (the TLS handshake), and agents learn
// the list from the state.

// refusedRevoked is the carve_master_auth_refusals_total reason of a
// request with a revoked certificate.
const refusedRevoked = "revoked"

// Labels of carve_master_revoked_refusals_total.
const (
	revokedOnAPI     = "api"
	revokedOnRaft    = "raft"
	revokedOnForward = "forward"
)

// revoke puts a certificate on the deny list (operators and masters: the
// authorize middleware refuses agents) and answers the whole list.
func (s *server) revoke() http.HandlerFunc {
	return handleWrite(s, write[api.RevokeRequest, state.Result]{
		body:    true,
		prepare: proposeBody(s, logcmd.RevokeCommand),
		answer: func(w http.ResponseWriter, res state.Result) {
			httpapi.WriteJSON(w, http.StatusOK, api.Revocations{Revoked: s.m.table.Revoked(), Deleted: res.Deleted})
		},
	})
}

// revocations answers the deny list.
func (s *server) revocations(w http.ResponseWriter, _ *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, api.Revocations{Revoked: s.m.table.Revoked()})
}

// revokedClient says why the request's own certificate is refused, or ""
// when it is not revoked. A forwarded request's original client is
// checked by revokedSerial, on the serial the forwarding master passes.
func (s *server) revokedClient(r *http.Request) string {
	leaf := clientLeaf(r)
	if leaf == nil || !s.m.table.IsRevoked(pki.Serial(leaf)) {
		return ""
	}
	s.m.metrics.trust.revokedRefusals.WithLabelValues(revokedOnAPI).Inc()
	return fmt.Sprintf("the client certificate %q (serial %s) is revoked: the masters refuse it; issue the holder a new certificate (carve certs issue) if it is to stay", leaf.Subject.CommonName, pki.Serial(leaf))
}

// revokedSerial says why the certificate of serial, presented by who to
// the master that forwarded its request here, is refused, or "" when it
// is not revoked (or no serial was passed: a master of before serialHeader).
func (s *server) revokedSerial(serial, who string) string {
	if serial == "" || !s.m.table.IsRevoked(serial) {
		return ""
	}
	s.m.metrics.trust.revokedRefusals.WithLabelValues(revokedOnAPI).Inc()
	return fmt.Sprintf("the client certificate of %s (serial %s) is revoked: the masters refuse it; issue the holder a new certificate (carve certs issue) if it is to stay", who, serial)
}

// clientLeaf is the request's verified client certificate, or nil.
func clientLeaf(r *http.Request) *x509.Certificate {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	return r.TLS.VerifiedChains[0][0]
}

// refuseRevokedPeers makes the Raft transport (both ways) and the
// connections that forward to the leader refuse a master certificate on
// the deny list at the handshake.
func (m *Master) refuseRevokedPeers(sec *security) {
	counted := func(where string) func() {
		return m.metrics.trust.revokedRefusals.WithLabelValues(where).Inc
	}
	sec.raft.Server.VerifyConnection = pki.RefuseRevoked(sec.raft.Server.VerifyConnection, m.table.IsRevoked, counted(revokedOnRaft))
	sec.raft.Client.VerifyConnection = pki.RefuseRevoked(sec.raft.Client.VerifyConnection, m.table.IsRevoked, counted(revokedOnRaft))
	sec.client.VerifyConnection = pki.RefuseRevoked(sec.client.VerifyConnection, m.table.IsRevoked, counted(revokedOnForward))
}

// watchRevocations, until ctx ends, closes the Raft connections of
// certificates revoked since (the table signals each revocation, and each
// restore of a snapshot holding some; state.LeaseTable.Revocations).
func (m *Master) watchRevocations(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.table.Revocations():
			m.closeRevokedConns()
		}
	}
}

// closeRevokedConns closes the Raft connections a revoked master
// certificate still holds open: the handshake refuses it from then on.
func (m *Master) closeRevokedConns() {
	n := m.node.CloseConnsWhere(func(c *x509.Certificate) bool { return m.table.IsRevoked(pki.Serial(c)) })
	if n > 0 {
		m.log.Warn("closed the Raft connections of revoked certificates", "connections", n)
		m.metrics.trust.revokedRefusals.WithLabelValues(revokedOnRaft).Add(float64(n))
	}
}
