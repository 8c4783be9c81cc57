package vxlan

import (
	"context"
	"fmt"
)

// execute runs the plan in its phases and turns cur into the entries now
// known to be programmed by carve: its own entries, minus successful
// deletions, plus successful sets. A failed set leaves its key out (unknown
// state, so the next Apply tries again); a failed delete keeps it (so it is
// retried). Updating cur in place keeps an incremental Apply from copying
// the whole state.
func (d *Dataplane) execute(ctx context.Context, p *plan, idx int, cur *current, rep *Report) {
	// Entries read back from the kernel that are not carve's are not
	// remembered (FDB entries on the VTEP all are).
	for k, c := range cur.neigh {
		if !c.ours {
			delete(cur.neigh, k)
		}
	}
	for k, c := range cur.route {
		if !c.ours {
			delete(cur.route, k)
		}
	}
	if p.empty() {
		return
	}
	out := cur
	var b batch
	run := func() []error {
		errs := d.sock.exec(&b, ctx.Err)
		b = batch{buf: b.buf[:0], offs: b.offs[:0]}
		return errs
	}
	delRoutes := func(ops []routeOp) {
		for _, o := range ops {
			b.routeDel(o.key)
		}
		for i, err := range run() {
			o := ops[i]
			switch {
			case err == nil:
				if !o.isNew { // else counted as the update of the prefix
					rep.Routes.Removed++
				}
				delete(out.route, o.key)
			case isGone(err):
				delete(out.route, o.key)
			default:
				rep.fail(KindRoute, routeName(o.key), o.peer, "delete", err)
			}
		}
	}
	// The routes to prefixes no longer routed.
	delRoutes(p.routeDel)
	// Additions: neighbour, FDB, route.
	for _, o := range p.neighSet {
		b.neighSet(idx, o.ip, o.mac)
	}
	for i, err := range run() {
		o := p.neighSet[i]
		if err != nil {
			rep.fail(KindNeighbour, o.ip.String(), o.peer, opName(o.isNew), err)
			delete(out.neigh, o.ip)
			continue
		}
		count(&rep.Neighbours, o.isNew)
		out.neigh[o.ip] = curNeigh{mac: o.mac, ours: true, good: true}
	}
	for _, o := range p.fdbSet {
		b.fdbSet(idx, o.mac, o.dst)
	}
	for i, err := range run() {
		o := p.fdbSet[i]
		if err != nil {
			rep.fail(KindFDB, o.mac.String(), o.peer, opName(o.isNew), err)
			delete(out.fdb, o.mac)
			continue
		}
		count(&rep.FDB, o.isNew)
		out.fdb[o.mac] = curFDB{dst: o.dst, good: true}
	}
	for _, o := range p.routeSet {
		b.routeSet(o.oif, o.key, o.via, o.oif != idx)
	}
	for i, err := range run() {
		o := p.routeSet[i]
		if err != nil {
			rep.fail(KindRoute, routeName(o.key), o.peer, opName(o.isNew), err)
			delete(out.route, o.key)
			continue
		}
		count(&rep.Routes, o.isNew)
		out.route[o.key] = curRoute{via: o.via, oif: o.oif, ours: true, good: true}
	}
	// Then the old routes of prefixes that stay routed (make before
	// break), and the FDB and neighbour entries no route uses any more.
	delRoutes(p.routeMove)
	for _, o := range p.fdbDel {
		b.fdbDel(idx, o.mac)
	}
	for i, err := range run() {
		o := p.fdbDel[i]
		switch {
		case err == nil:
			rep.FDB.Removed++
			delete(out.fdb, o.mac)
		case isGone(err):
			delete(out.fdb, o.mac)
		default:
			rep.fail(KindFDB, o.mac.String(), o.peer, "delete", err)
		}
	}
	for _, o := range p.neighDel {
		b.neighDel(idx, o.ip)
	}
	for i, err := range run() {
		o := p.neighDel[i]
		switch {
		case err == nil:
			rep.Neighbours.Removed++
			delete(out.neigh, o.ip)
		case isGone(err):
			delete(out.neigh, o.ip)
		default:
			rep.fail(KindNeighbour, o.ip.String(), o.peer, "delete", err)
		}
	}
}

func routeName(k routeKey) string {
	return fmt.Sprintf("%s metric %d", k.dst, k.metric)
}

func opName(isNew bool) string {
	if isNew {
		return "add"
	}
	return "replace"
}

func count(c *Counts, isNew bool) {
	if isNew {
		c.Added++
	} else {
		c.Updated++
	}
}
