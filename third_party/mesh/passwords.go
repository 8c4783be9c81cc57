package mesh

// Two passwords during a change of the mesh password (carve's patch, see
// PATCHED.md): each side seals what it sends with the session key of its
// own password (Config.Password) and opens what it receives with the
// session key of whichever of its passwords (Password, then
// Config.AcceptedPasswords) opens the peer's first message. Changing the
// password takes three rounds, each over every peer: accept the next one,
// send with it, drop the old; peers a round apart always understand each
// other, so gossip never splits.

import (
	"bytes"
	"errors"
	"fmt"

	"golang.org/x/crypto/nacl/secretbox"
)

// errPasswordChange refuses SetPasswords from encryption to none or back:
// the handshake of peers a round apart would fail.
var errPasswordChange = errors.New("mesh: passwords can change, encryption cannot be turned on or off on a running router")

// passwords returns the password to send with and those accepted besides.
func (router *Router) passwords() ([]byte, [][]byte) {
	router.passwordLock.RLock()
	defer router.passwordLock.RUnlock()
	return router.Password, router.AcceptedPasswords
}

// SetPasswords replaces the password sent with and those accepted besides,
// for connections made from now on; connections up keep their keys.
func (router *Router) SetPasswords(password []byte, accepted [][]byte) error {
	router.passwordLock.Lock()
	defer router.passwordLock.Unlock()
	if (password == nil) != (router.Password == nil) {
		return errPasswordChange
	}
	router.Password = bytes.Clone(password)
	router.AcceptedPasswords = nil
	for _, p := range accepted {
		router.AcceptedPasswords = append(router.AcceptedPasswords, bytes.Clone(p))
	}
	return nil
}

// candidateReceiver is an encryptedTCPReceiver that does not know yet which
// of its session keys the peer seals with: the first message that opens
// with one of them fixes it.
type candidateReceiver struct {
	receiver tcpReceiver
	states   []*tcpCryptoState
	chosen   *tcpCryptoState
}

func newCandidateReceiver(receiver tcpReceiver, keys []*[32]byte, outbound bool) *candidateReceiver {
	r := &candidateReceiver{receiver: receiver}
	for _, k := range keys {
		r.states = append(r.states, newTCPCryptoState(k, !outbound))
	}
	return r
}

// Receive implements tcpReceiver.
func (r *candidateReceiver) Receive() ([]byte, error) {
	msg, err := r.receiver.Receive()
	if err != nil {
		return nil, err
	}
	if r.chosen != nil {
		out, ok := secretbox.Open(nil, msg, &r.chosen.nonce, r.chosen.sessionKey)
		if !ok {
			return nil, fmt.Errorf("Unable to decrypt TCP msg")
		}
		r.chosen.advance()
		return out, nil
	}
	for _, s := range r.states {
		if out, ok := secretbox.Open(nil, msg, &s.nonce, s.sessionKey); ok {
			r.chosen, r.states = s, nil
			s.advance()
			return out, nil
		}
	}
	// The wording is the one carve recognises as a password mismatch.
	return nil, fmt.Errorf("Unable to decrypt TCP msg")
}
