package vxlan

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// LinkMaster reads which device a link is enslaved to (a container's host
// veth to its bridge): the master's name, "" when it has none, and
// exists=false when there is no such link. carve ipam check uses it to find
// containers attached to a bridge that no longer exists.
func (d *Dataplane) LinkMaster(name string) (master string, exists bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return "", false, errors.New("vxlan: the dataplane is closed")
	}
	l, err := d.h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("vxlan: link %s: %w", name, err)
	}
	idx := l.Attrs().MasterIndex
	if idx == 0 {
		return "", true, nil
	}
	m, err := d.h.LinkByIndex(idx)
	if err != nil {
		return "", true, fmt.Errorf("vxlan: master %d of %s: %w", idx, name, err)
	}
	return m.Attrs().Name, true, nil
}
