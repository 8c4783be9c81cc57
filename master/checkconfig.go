package master

import (
	"io"
	"log/slog"
)

// CheckOptions runs the checks Start runs on its security options (TLS
// files, the certificate's role, the signing key) without starting
// anything: carve master --check-config calls it.
func CheckOptions(opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	_, err := newSecurity(opts, log)
	return err
}
