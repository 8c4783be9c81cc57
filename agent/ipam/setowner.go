package ipam

import (
	"net/http"
	"reflect"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// SetOwner records owner as the owner of an attachment the agent holds. A
// runtime that learns who holds an address only after allocating it (Docker's
// IPAM request names no container: the plugin looks the container up in the
// engine once its endpoint exists) names it here, so that carve ipam show and
// the "taken" errors name the container. The addresses stay as they are.
func (s *Service) SetOwner(network, containerID, ifName string, owner *api.Owner) error {
	if err := owner.Validate(); err != nil {
		return failure(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	at := ring.Attachment{ContainerID: containerID, Interface: ifName}
	key := allocKey(network, at)
	s.mu.Lock()
	for s.commits.WaitPending(key) {
	}
	o := s.overlays[network]
	var rec allocRecord
	ok := false
	if o != nil {
		rec, ok = o.Attached[at]
	}
	if !ok {
		s.mu.Unlock()
		return failure(http.StatusNotFound, api.CodeNotFound, "%s/%s holds no address on %q", containerID, ifName, network)
	}
	if reflect.DeepEqual(rec.Owner, owner) {
		s.mu.Unlock()
		return nil
	}
	prev := rec
	rec.Owner = owner
	o.Attached[at] = rec
	b := s.commits.Enqueue(change{Key: key, Writes: []write{putAlloc(network, at, rec)}, Undo: func() {
		if cur, ok := o.Attached[at]; ok && reflect.DeepEqual(cur.Owner, owner) {
			o.Attached[at] = prev
		}
	}})
	s.mu.Unlock()
	if err := s.commits.Flush(b); err != nil {
		return failure(http.StatusInternalServerError, api.CodeInternal, "persist owner: %v", err)
	}
	return nil
}
