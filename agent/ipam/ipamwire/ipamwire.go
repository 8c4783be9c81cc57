// Package ipamwire is the wire format of the agents' ring channel
// (carve-rings): the ring messages (deltas, digests, bucket hashes,
// pushes) and the space messages (requests for space, grants, refusals),
// each message type with its encoding and its strict, bounded decoding,
// and, for each signed message, the one function that gives the bytes its
// signature covers and the one that verifies it.
//
// It is pure: no I/O, no goroutines, no state. agent/ipam decides what to
// send and what a received message changes; this package decides what the
// bytes are. The bytes never change within a version: agents of the
// previous release read them (testdata/golden.json holds them as the
// release before this package encoded them).
//
// Which bytes are signed, and which are used:
//
//   - A ring token (a claim) is signed by its writer's claim key over the
//     bytes package ring gives it (ring.Claim.Msg): SignClaims and
//     VerifyClaim here, the bytes in ring.
//   - A space request is signed by its sender's claim key over
//     SpaceRequestSigningBytes: a domain and the request without its
//     signature, as JSON. VerifySpaceRequest checks it.
//   - A grant carries its donor's statement (api.GrantSigningBytes: the
//     cluster, overlay, prefix, donor, recipient, request id and expiry),
//     which the recipient reports to the masters: GrantStatement builds
//     it from the answer, SignGrant and VerifyGrant sign and check it.
//
// Nothing else on the channel is signed: a ring message carries rings
// whose tokens are, and a digest, bucket hashes or a refusal only ask for
// or decline an exchange, never change what anyone owns.
package ipamwire

import (
	"errors"
	"unicode"
)

// Limits of what is decoded.
const (
	// MaxMessageBytes bounds one message on the channel (mesh's own limit
	// is 10 MiB).
	MaxMessageBytes = 8 << 20
	// MaxClusterIDLen bounds the cluster id of a message.
	MaxClusterIDLen = 256
	// MaxDigestRings bounds the rings of a digest and of bucket hashes
	// (two families per overlay).
	MaxDigestRings = 1024
	// MaxSpaceRequestBytes bounds a space request (no ring in it).
	MaxSpaceRequestBytes = 4 << 10
	// MaxRequestIDLen bounds a space request's id.
	MaxRequestIDLen = 128
	// MaxReasonLen bounds a refusal's reason.
	MaxReasonLen = 512
	// MaxSigLen bounds a signature in standard base64 (ed25519: 88).
	MaxSigLen = 128
)

// Errors of decoding, for callers that branch.
var (
	// ErrBadRingMessage marks a ring message that cannot be decoded.
	ErrBadRingMessage = errors.New("bad ring message")
	// ErrBadSpaceMessage marks a space request or answer that is refused.
	ErrBadSpaceMessage = errors.New("bad space message")
)

// printable tells whether s has only printable characters.
func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
