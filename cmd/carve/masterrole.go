package main

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/carve-net/carve/pki"
)

// requireMaster is the VerifyConnection of every operator command's
// connections to the masters: a certificate of the CA is not enough (an
// agent's would do), the server's must carry role master, or whoever
// holds another could answer as the masters.
func requireMaster(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return errors.New("not a master: the server gave no verified certificate")
	}
	id, err := pki.IdentityOf(cs.VerifiedChains[0][0])
	if err != nil {
		return fmt.Errorf("not a master: the server's certificate carries no carve role (%w)", err)
	}
	if id.Role != pki.RoleMaster {
		return fmt.Errorf("not a master: the server's certificate is %s (role %s): --masters must name masters, whose certificates carry role master", id, id.Role)
	}
	return nil
}
