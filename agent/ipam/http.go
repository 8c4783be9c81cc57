package ipam

import (
	"context"
	"net"

	"github.com/carve-net/carve/agent/ipam/ipamsock"
)

// Serve serves the unix-socket API (package ipamsock) on ln until ctx ends.
func (s *Service) Serve(ctx context.Context, ln net.Listener) {
	ipamsock.Serve(ctx, ln, s, s.log)
}
