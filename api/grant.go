package api

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Signed grants.
//
// A donor that grants a block through the ring signs a grant statement
// with its claim key (AgentKeys.Claim, carried in its master-signed
// record), and the recipient reports the grant to the masters with it: the
// masters record a grant reported by its recipient only under the donor's
// signature, so that no agent can report a grant its donor never made.
//
// GrantSigningBytes, format version 1:
//
//	"carve-grant-v1" 0x00
//	str(cluster_id) str(overlay) str(prefix) str(donor) str(recipient)
//	str(request_id) u64(expires, Unix seconds)
//
// with str and u64 as in RecordSigningBytes. The cluster id keeps a grant
// of one cluster from verifying in another; the request id makes a grant
// repeated under it one grant (the masters remember recent request ids);
// expires bounds how long a statement may be replayed.

// GrantLifetime is how long a signed grant may be reported after it was
// made: long enough for a recipient cut off from the masters to report it,
// short enough that an old statement cannot move a block back much later.
const GrantLifetime = 7 * 24 * time.Hour

// Errors of a grant statement's check, for callers that branch.
var (
	// ErrGrantUnsigned: a recipient's report without the donor's signature.
	ErrGrantUnsigned = errors.New("grant not signed by its donor")
	// ErrGrantExpired: the statement's expiry passed.
	ErrGrantExpired = errors.New("signed grant expired")
	// ErrGrantBadSignature: the signature does not verify under the donor's
	// claim key, or the donor has none.
	ErrGrantBadSignature = errors.New("grant signature does not verify under the donor's claim key")
)

// GrantSigningBytes is what a donor signs to grant a block (see above).
func GrantSigningBytes(g GrantReport, clusterID string) []byte {
	b := append([]byte("carve-grant-v1"), 0)
	for _, s := range []string{clusterID, g.Overlay, g.Prefix, g.Donor, g.Recipient, g.RequestID} {
		b = appendString(b, s)
	}
	return binary.BigEndian.AppendUint64(b, uint64(max(g.Expires, 0)))
}

// SignGrant sets g's donor signature, by the donor's claim key.
func SignGrant(key ed25519.PrivateKey, g *GrantReport, clusterID string) {
	g.DonorSignature = Sign(key, GrantSigningBytes(*g, clusterID))
}

// VerifyGrant checks a grant statement: signed by the donor's claim key
// (standard base64, as its record carries it) and not expired at now. The
// error wraps one of the ErrGrant sentinels and says what is wrong.
func VerifyGrant(g GrantReport, donorClaimKey, clusterID string, now time.Time) error {
	if g.DonorSignature == "" {
		return fmt.Errorf("%w: a recipient reports a grant only with donor_signature, the donor's signature of it (or the donor reports it)", ErrGrantUnsigned)
	}
	if g.Expires <= now.Unix() {
		return fmt.Errorf("%w: it expired at %s", ErrGrantExpired, time.Unix(g.Expires, 0).UTC().Format(time.RFC3339))
	}
	pub, err := base64.StdEncoding.DecodeString(donorClaimKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: the masters hold no claim key of donor %q", ErrGrantBadSignature, g.Donor)
	}
	sig, err := base64.StdEncoding.DecodeString(g.DonorSignature)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, GrantSigningBytes(g, clusterID), sig) {
		return fmt.Errorf("%w: grant of %s from %q to %q", ErrGrantBadSignature, g.Prefix, g.Donor, g.Recipient)
	}
	return nil
}
