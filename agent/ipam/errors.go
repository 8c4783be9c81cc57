package ipam

import (
	"fmt"

	"github.com/carve-net/carve/api"
)

// failure is an IPAM error: an *api.Error carrying the HTTP status and the
// code the socket API answers with, and that callers branch on (api.IsCode).
func failure(status int, code, format string, args ...any) error {
	return &api.Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}
