// Package ipfamily names the IPAM's address families, one way for every
// part of it: an index (0: IPv4, 1: IPv6) in every [Count] array, the name
// the API, the ring messages and the store's keys write ("4", "6"), and
// the number a grow request carries (4, 6).
package ipfamily

import "net/netip"

// Count is the number of families: index 0 is IPv4, 1 is IPv6.
const Count = 2

// Name is a family index as the API, the ring messages and the store's
// keys write it.
func Name(fam int) string {
	if fam == 1 {
		return "6"
	}
	return "4"
}

// Index is the index of a family name ("4", "6"; checked by the caller).
func Index(name string) int {
	if name == "6" {
		return 1
	}
	return 0
}

// Of is the family index of an address.
func Of(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// Number is 4 or 6.
func Number(fam int) int {
	if fam == 1 {
		return 6
	}
	return 4
}
