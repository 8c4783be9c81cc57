package netnslab

import (
	"fmt"
	"strconv"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
)

// UnderlayMTU is the MTU the lab's underlay bridge and veths were created
// with (Options.UnderlayMTU).
func (l *Lab) UnderlayMTU() int { return l.mtu }

// SetUnderlayMTU sets the MTU of h's underlay veth, both ends: Link inside
// h and its peer on the underlay bridge, so that h's packets are neither
// bigger nor smaller than what its link takes (a host on a network with
// another MTU than the others').
func (l *Lab) SetUnderlayMTU(h *Host, mtu int) error {
	peer := "h" + strconv.Itoa(h.Index)
	err := h.withNetlink(func(hh netlinksafe.Handle) error {
		link, err := hh.LinkByName(h.Link)
		if err != nil {
			return err
		}
		return hh.LinkSetMTU(link, mtu)
	})
	if err == nil {
		err = l.Underlay.withNetlink(func(uh netlinksafe.Handle) error {
			link, err := uh.LinkByName(peer)
			if err != nil {
				return err
			}
			return uh.LinkSetMTU(link, mtu)
		})
	}
	if err != nil {
		return fmt.Errorf("netnslab: MTU %d on the underlay link of host %d: %w", mtu, h.Index, err)
	}
	return nil
}

// LinkMTU returns the MTU of the link named link inside the namespace.
func (n *Namespace) LinkMTU(link string) (int, error) {
	mtu := 0
	err := n.withNetlink(func(h netlinksafe.Handle) error {
		l, err := h.LinkByName(link)
		if err != nil {
			return err
		}
		mtu = l.Attrs().MTU
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("netnslab: %s in %s: %w", link, n.Name, err)
	}
	return mtu, nil
}
