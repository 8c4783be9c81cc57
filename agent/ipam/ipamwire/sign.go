package ipamwire

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"net/netip"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// Errors of a signature check, for callers that count refusals by reason.
var (
	// ErrUnsigned marks a message that carries no signature.
	ErrUnsigned = errors.New("not signed")
	// ErrBadSignature marks a signature that does not verify under the
	// signer's key.
	ErrBadSignature = errors.New("bad signature")
)

// SignClaims is the signer of this agent's ring tokens (ring.Allocator
// SetSigner): the claim key's signature over the bytes package ring gives
// (ring.Claim.Msg).
func SignClaims(key ed25519.PrivateKey) func(msg []byte) []byte {
	return func(msg []byte) []byte { return ed25519.Sign(key, msg) }
}

// VerifyClaim tells whether a ring token's signature verifies under its
// writer's claim key.
func VerifyClaim(pub ed25519.PublicKey, c ring.Claim) bool {
	return len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, c.Msg, c.Sig)
}

// spaceDomain starts the signed bytes of a space request, so that no
// other signed message of the claim key can pass for one.
const spaceDomain = "carve space request v1\x00"

// SpaceRequestSigningBytes is what a requester signs: the domain and the
// request without its signature, as JSON (the receiver encodes the
// decoded request again: Go's encoding of the same struct is the same
// bytes, and decoding is strict, so no field it does not know is lost).
func SpaceRequestSigningBytes(m SpaceMessage) []byte {
	m.Sig = ""
	return append([]byte(spaceDomain), EncodeSpaceMessage(m)...)
}

// SignSpaceRequest signs a request with its sender's claim key.
func SignSpaceRequest(key ed25519.PrivateKey, m *SpaceMessage) {
	m.Sig = api.Sign(key, SpaceRequestSigningBytes(*m))
}

// VerifySpaceRequest checks a request's signature under its sender's
// claim key; the error is ErrUnsigned or wraps ErrBadSignature.
func VerifySpaceRequest(pub ed25519.PublicKey, m SpaceMessage) error {
	if m.Sig == "" {
		return ErrUnsigned
	}
	sig, err := base64.StdEncoding.DecodeString(m.Sig)
	if err != nil || len(pub) != ed25519.PublicKeySize || !ed25519.Verify(pub, SpaceRequestSigningBytes(m), sig) {
		return ErrBadSignature
	}
	return nil
}

// Grant names a grant through the ring: what its donor's statement
// covers (api.GrantSigningBytes, with the cluster id and the expiry).
type Grant struct {
	Overlay   string
	Prefix    netip.Prefix
	Donor     string
	Recipient string
	RequestID string
}

// Report is the grant as the masters learn it, with the donor's
// statement (its expiry and signature) from the answer.
func (g Grant) Report(expires int64, sig string) api.GrantReport {
	return api.GrantReport{Overlay: g.Overlay, Prefix: g.Prefix.String(), Donor: g.Donor, Recipient: g.Recipient,
		RequestID: g.RequestID, Expires: expires, DonorSignature: sig}
}

// SignGrant signs, as the donor, the statement of a grant that its
// recipient reports to the masters, valid for api.GrantLifetime from now:
// the Expires and GrantSig of the answer.
func SignGrant(key ed25519.PrivateKey, clusterID string, g Grant, now time.Time) (expires int64, sig string) {
	r := g.Report(now.Add(api.GrantLifetime).Unix(), "")
	api.SignGrant(key, &r, clusterID)
	return r.Expires, r.DonorSignature
}

// VerifyGrant checks a grant answer's statement under the donor's claim
// key (nil: none known), as the masters will (api.VerifyGrant, whose
// sentinel errors it wraps).
func VerifyGrant(donorKey ed25519.PublicKey, clusterID string, g Grant, ans SpaceMessage, now time.Time) error {
	key := ""
	if donorKey != nil {
		key = base64.StdEncoding.EncodeToString(donorKey)
	}
	return api.VerifyGrant(g.Report(ans.Expires, ans.GrantSig), key, clusterID, now)
}
