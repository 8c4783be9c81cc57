package e2e

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// rogueAgent is issue 26's adversary: a compromised host holding its agent
// certificate, its claim key and the mesh password, whose agent the
// attacker replaced. Every step draws what it does from a seeded RNG and
// signs what it can: ring messages through a `carve-lab rogue-gossip
// --reload` peer in its namespace (message is the file that peer reads),
// and requests to the masters with its certificate (client).
type rogueAgent struct {
	t       *testing.T
	c       *labcluster.Cluster
	host    *labcluster.Host
	honest  []*labcluster.Host
	client  *apiclient.Client
	key     ed25519.PrivateKey
	rng     *rand.Rand
	message string // the file the rogue peer broadcasts

	clusterID string
	universe  netip.Prefix // overlay carve's IPv4 subnet
	// sent are the ring messages broadcast so far (encoded rings of carve
	// IPv4), for the replays.
	sent [][]byte
	// statements are the grant statements signed so far, for the replays;
	// moved those the masters took (they moved space).
	statements, moved []api.GrantReport
	// snapshot is `carve snapshot save`'s file from before the rogue
	// acted; restored tells the operator restored it (once a run).
	snapshot string
	restored bool
	// did counts the steps by kind, and outcomes what each answered.
	did      map[string]int
	outcomes map[string]int
}

// rogueStep is one kind of thing the rogue does.
type rogueStep struct {
	name string
	do   func(r *rogueAgent, ctx context.Context) string // what happened, for the log
}

// Names of the steps that grant the rogue's space through the ring.
const (
	stepRingGrant  = "ring grant of its own space to an honest host"
	stepEquivocate = "the same range granted to two honest hosts"
)

// rogueSteps are every kind of message the rogue can sign.
func rogueSteps() []rogueStep {
	return []rogueStep{
		{stepRingGrant, (*rogueAgent).ringGrant},
		{stepEquivocate, (*rogueAgent).equivocate},
		{"grow, ring grant of the block, return it to the masters", (*rogueAgent).grantAndReturn},
		{"grant statement reported to the masters (donor)", (*rogueAgent).reportGrant},
		{"replay of a grant statement", (*rogueAgent).replayStatement},
		{"replay of an earlier ring message", (*rogueAgent).replayRing},
		{"ring message replayed in another overlay or family", (*rogueAgent).otherUniverse},
		{"registration with another host's identity or keys", (*rogueAgent).stealRegistration},
		{"operator restores a snapshot, the rogue replays its used statements", (*rogueAgent).restoreAndReplay},
	}
}

// record is the masters' record of the rogue now.
func (r *rogueAgent) record(ctx context.Context) (*api.AgentInfo, error) {
	return r.client.Agent(ctx, r.host.AgentID())
}

// pick is a random honest host.
func (r *rogueAgent) pick() *labcluster.Host { return r.honest[r.rng.IntN(len(r.honest))] }

// leaseSet is the rogue's complete lease set in carve's IPv4 universe, as
// its masters' record gives it: what its ring claims are signed on.
func (r *rogueAgent) leaseSet(rec *api.AgentInfo) ring.LeaseSet {
	set := ring.LeaseSet{Owner: rec.AgentID, Version: rec.Version}
	pr := membership.NewPeerRecord(rec)
	for _, s := range pr.LeasePrefixes() {
		if p, err := netip.ParsePrefix(s); err == nil && r.universe.Contains(p.Addr()) && p.Bits() > r.universe.Bits() {
			set.Prefixes = append(set.Prefixes, p)
		}
	}
	return set
}

// grantRing is the rogue's ring at its record, signed with its claim key,
// with each grant made: what an honest agent would gossip after granting.
func (r *rogueAgent) grantRing(rec *api.AgentInfo, grants map[netip.Prefix]string) ([]byte, error) {
	a, err := ring.NewAllocator(rec.AgentID, r.universe)
	if err != nil {
		return nil, err
	}
	a.SetSigner(func(msg []byte) []byte { return ed25519.Sign(r.key, msg) })
	if _, err := a.SeedSets([]ring.LeaseSet{r.leaseSet(rec)}, nil); err != nil {
		return nil, fmt.Errorf("seed the rogue's ring: %w", err)
	}
	for p, to := range grants {
		if err := a.Grant(to, p); err != nil {
			return nil, fmt.Errorf("grant %s to %s: %w", p, to, err)
		}
	}
	return a.Ring().Claims().Encode(), nil
}

// broadcast has the rogue peer say ring (carve's, unless overlay and
// family say otherwise) from its next tick on.
func (r *rogueAgent) broadcast(overlay, family string, enc []byte) error {
	data, err := labcluster.RingMessage(r.clusterID, overlay, family, enc)
	if err != nil {
		return err
	}
	tmp := r.message + ".next"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if overlay == "carve" && family == "4" {
		r.sent = append(r.sent, enc)
	}
	return os.Rename(tmp, r.message)
}

// randomRange is a random aligned range inside one of the rogue's
// prefixes: a /(bits+1) to a /28.
func (r *rogueAgent) randomRange(set ring.LeaseSet) (netip.Prefix, bool) {
	if len(set.Prefixes) == 0 {
		return netip.Prefix{}, false
	}
	p := set.Prefixes[r.rng.IntN(len(set.Prefixes))]
	if p.Bits() >= 28 {
		return p, true
	}
	bits := p.Bits() + 1 + r.rng.IntN(28-p.Bits())
	n := 1 << (bits - p.Bits())
	base := p.Addr().As4()
	off := uint32(r.rng.IntN(n)) << (32 - bits)
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += off
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), bits), true
}

func (r *rogueAgent) ringGrant(ctx context.Context) string {
	rec, err := r.record(ctx)
	if err != nil {
		return "no record: " + err.Error()
	}
	p, ok := r.randomRange(r.leaseSet(rec))
	if !ok {
		return "no space"
	}
	to := r.pick()
	enc, err := r.grantRing(rec, map[netip.Prefix]string{p: to.AgentID()})
	if err == nil {
		err = r.broadcast("carve", "4", enc)
	}
	return fmt.Sprintf("%s to %s: %v", p, to.Name, errOr(err, "broadcast"))
}

func (r *rogueAgent) equivocate(ctx context.Context) string {
	rec, err := r.record(ctx)
	if err != nil {
		return "no record: " + err.Error()
	}
	p, ok := r.randomRange(r.leaseSet(rec))
	if !ok || len(r.honest) < 2 {
		return "no space"
	}
	var out []string
	for _, to := range r.honest {
		enc, err := r.grantRing(rec, map[netip.Prefix]string{p: to.AgentID()})
		if err == nil {
			err = r.broadcast("carve", "4", enc)
		}
		out = append(out, fmt.Sprintf("%s to %s: %v", p, to.Name, errOr(err, "broadcast")))
		if !r.pause(ctx, 2*rogueInterval) { // each heard on its own
			break
		}
	}
	return strings.Join(out, "; ")
}

func (r *rogueAgent) grantAndReturn(ctx context.Context) string {
	rec, err := r.client.Grow(ctx, r.host.AgentID(), api.GrowRequest{Overlay: "carve", Bridge: api.BridgeMesos, Family: "4"})
	if err != nil {
		return "grow: " + r.outcome(err)
	}
	r.outcome(nil)
	var grown netip.Prefix
	for _, b := range rec.Overlay("carve").Blocks {
		if p := netip.MustParsePrefix(b.Prefix); b.Origin == api.BlockGrown && (!grown.IsValid() || p.Addr().Compare(grown.Addr()) > 0) {
			grown = p
		}
	}
	if !grown.IsValid() {
		return "grow gave no block"
	}
	to := r.pick()
	enc, err := r.grantRing(rec, map[netip.Prefix]string{grown: to.AgentID()})
	if err == nil {
		err = r.broadcast("carve", "4", enc)
	}
	st := r.statement(grown, to)
	_, rerr := r.client.ReturnBlock(ctx, r.host.AgentID(), api.ReturnRequest{Overlay: "carve", Prefix: grown.String()})
	return fmt.Sprintf("grew %s, granted it to %s (%v), returned it: %s", grown, to.Name, errOr(err, "broadcast"), r.outcome(rerr)) +
		"; its statement to " + to.Name + ": " + r.report(ctx, st)
}

// statement is the rogue's signed grant statement of p to h.
func (r *rogueAgent) statement(p netip.Prefix, h *labcluster.Host) api.GrantReport {
	g := api.GrantReport{Overlay: "carve", Prefix: p.String(), Donor: r.host.AgentID(), Recipient: h.AgentID(),
		RequestID: api.NewRequestID(), Expires: time.Now().Add(time.Hour).Unix()}
	api.SignGrant(r.key, &g, r.clusterID)
	r.statements = append(r.statements, g)
	return g
}

// report sends g to the masters as its donor, the rogue, reports it.
func (r *rogueAgent) report(ctx context.Context, g api.GrantReport) string {
	_, err := r.client.ReportGrant(ctx, r.host.AgentID(), g)
	if err == nil && !slices.ContainsFunc(r.moved, func(m api.GrantReport) bool { return m.DonorSignature == g.DonorSignature }) {
		r.moved = append(r.moved, g)
	}
	return r.outcome(err)
}

func (r *rogueAgent) reportGrant(ctx context.Context) string {
	rec, err := r.record(ctx)
	if err != nil {
		return "no record: " + err.Error()
	}
	var grown []netip.Prefix
	for _, b := range rec.Overlay("carve").Blocks {
		if b.Origin == api.BlockGrown {
			grown = append(grown, netip.MustParsePrefix(b.Prefix))
		}
	}
	var p netip.Prefix
	if len(grown) > 0 && r.rng.IntN(2) == 0 {
		p = grown[r.rng.IntN(len(grown))] // a block it holds: a real donation
	} else if p, _ = r.randomRange(r.leaseSet(rec)); !p.IsValid() {
		return "no space"
	}
	to := r.pick()
	return fmt.Sprintf("%s to %s: %s", p, to.Name, r.report(ctx, r.statement(p, to)))
}

func (r *rogueAgent) replayStatement(ctx context.Context) string {
	if len(r.statements) == 0 {
		return "no statement yet"
	}
	g := r.statements[r.rng.IntN(len(r.statements))]
	return fmt.Sprintf("%s to %s: %s", g.Prefix, g.Recipient, r.report(ctx, g))
}

func (r *rogueAgent) replayRing(context.Context) string {
	if len(r.sent) == 0 {
		return "no message yet"
	}
	i := r.rng.IntN(len(r.sent))
	return fmt.Sprintf("message %d of %d: %v", i+1, len(r.sent), errOr(r.broadcast("carve", "4", r.sent[i]), "broadcast"))
}

func (r *rogueAgent) otherUniverse(ctx context.Context) string {
	enc := []byte(nil)
	if len(r.sent) > 0 {
		enc = r.sent[r.rng.IntN(len(r.sent))]
	} else {
		rec, err := r.record(ctx)
		if err != nil {
			return "no record: " + err.Error()
		}
		if enc, err = r.grantRing(rec, nil); err != nil {
			return err.Error()
		}
	}
	where := [][2]string{{rogueOtherOverlay, "4"}, {"carve", "6"}, {rogueOtherOverlay, "6"}}[r.rng.IntN(3)]
	return fmt.Sprintf("carve's IPv4 ring as overlay %s family %s: %v", where[0], where[1], errOr(r.broadcast(where[0], where[1], enc), "broadcast"))
}

// restoreAndReplay is the operator restoring the snapshot saved before the
// rogue acted (the real `carve snapshot restore`, once a run; later draws
// replay a statement instead), after which the rogue replays every grant
// statement that moved space: a statement moves space once. The restore
// keeps a live recipient's grant (keep_live), so the replay finds the
// space its recipient's already and moves nothing; where the restored
// records hold it in the rogue's name again, the replay is refused.
func (r *rogueAgent) restoreAndReplay(ctx context.Context) string {
	if r.restored || r.snapshot == "" {
		return r.replayStatement(ctx)
	}
	r.restored = true
	before, err := r.c.State(ctx)
	if err != nil {
		return "state: " + err.Error()
	}
	args := append([]string{"snapshot", "restore", r.snapshot, "--masters", strings.Join(r.c.MasterURLs(), ",")}, r.c.OperatorArgs()...)
	if out, err := r.c.RunCarve(ctx, r.honest[0], args...); err != nil {
		r.t.Errorf("carve snapshot restore: %v\n%s", err, out)
		return "restore failed"
	}
	err = retry.Until(ctx, 100*time.Millisecond, func() error {
		st, err := r.c.State(ctx)
		if err == nil && (st.Restore == nil || before.Restore != nil && st.Restore.Epoch <= before.Restore.Epoch) {
			err = errors.New("the masters show no new restore yet")
		}
		return err
	})
	if err != nil {
		return "restore not seen: " + err.Error()
	}
	restored, err := r.c.State(ctx)
	if err != nil {
		return "state: " + err.Error()
	}
	out := []string{fmt.Sprintf("restored; %d statements had moved space", len(r.moved))}
	for _, g := range r.moved {
		_, err := r.client.ReportGrant(ctx, r.host.AgentID(), g)
		if err == nil && !recordHolds(restored, g.Recipient, g.Overlay, g.Prefix) {
			r.t.Errorf("after the restore the masters took again the statement of %s from %s to %s, which had moved it already", g.Prefix, g.Donor, g.Recipient)
		}
		out = append(out, fmt.Sprintf("replay of %s to %s: %s", g.Prefix, g.Recipient, r.outcome(err)))
	}
	return strings.Join(out, "; ")
}

// recordHolds tells whether agent id's record in st holds a block of
// overlay containing prefix.
func recordHolds(st *api.State, id, overlay, prefix string) bool {
	p, err := netip.ParsePrefix(prefix)
	if err != nil {
		return false
	}
	for _, rec := range st.Agents {
		if rec.AgentID != id {
			continue
		}
		for _, ov := range rec.Overlays {
			if ov.Info.Name != overlay {
				continue
			}
			for _, b := range ov.Blocks {
				if q, err := netip.ParsePrefix(b.Prefix); err == nil && q.Contains(p.Addr()) && q.Bits() <= p.Bits() {
					return true
				}
			}
		}
	}
	return false
}

func (r *rogueAgent) stealRegistration(ctx context.Context) string {
	rec, err := r.record(ctx)
	if err != nil {
		return "no record: " + err.Error()
	}
	victim := r.pick()
	vrec, err := r.client.Agent(ctx, victim.AgentID())
	if err != nil {
		return "no record of " + victim.Name + ": " + err.Error()
	}
	req := api.RegisterRequest{AgentID: rec.AgentID, IP: rec.IP, MeshAddr: rec.MeshAddr, Keys: rec.Keys, NetworkConfig: rec.NetworkConfig}
	kinds := []string{"ip", "mesh_addr", "claim key", "agent id"}
	if vrec.Keys.WireGuard != "" {
		kinds = append(kinds, "wireguard key")
	}
	kind := kinds[r.rng.IntN(len(kinds))]
	switch kind {
	case "ip":
		req.IP, req.MeshAddr = vrec.IP, vrec.MeshAddr
	case "mesh_addr":
		req.MeshAddr = vrec.MeshAddr
		if req.MeshAddr == "" {
			req.MeshAddr = net.JoinHostPort(vrec.IP, fmt.Sprint(labcluster.AgentMeshPort))
		}
	case "claim key":
		req.Keys.Claim = vrec.Keys.Claim
	case "wireguard key":
		req.Keys.WireGuard = vrec.Keys.WireGuard
	case "agent id":
		req.AgentID, req.IP, req.MeshAddr, req.Keys = vrec.AgentID, vrec.IP, vrec.MeshAddr, vrec.Keys
	}
	_, err = r.client.Register(ctx, req)
	if err == nil {
		r.t.Errorf("the masters took the rogue's registration with %s's %s: %+v", victim.Name, kind, req)
	}
	return fmt.Sprintf("%s's %s: %s", victim.Name, kind, r.outcome(err))
}

// outcome names what the masters answered (ok, or the API's code), and
// counts it.
func (r *rogueAgent) outcome(err error) string {
	s := "ok"
	var e *api.Error
	switch {
	case errors.As(err, &e):
		s = fmt.Sprintf("%d %s", e.Status, e.Code)
	case err != nil:
		s = "error"
	}
	r.outcomes[s]++
	if err != nil {
		return s + ": " + err.Error()
	}
	return s
}

// pause waits d (the rogue's pace, not a condition), or until ctx ends.
func (r *rogueAgent) pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// run does random steps until ctx ends, each followed by check (the
// invariants that hold at every moment), and logs them.
func (r *rogueAgent) run(ctx context.Context, check func() error) {
	steps := rogueSteps()
	for step := 1; ctx.Err() == nil; step++ {
		s := steps[r.rng.IntN(len(steps))]
		r.did[s.name]++
		what := s.do(r, ctx)
		r.t.Logf("rogue step %d: %s: %s", step, s.name, what)
		if !r.pause(ctx, 2*rogueInterval) { // heard by every agent
			return
		}
		if err := check(); err != nil {
			r.t.Errorf("after rogue step %d (%s): %v", step, s.name, err)
			return
		}
	}
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

// sortedCounts formats counts by key.
func sortedCounts(m map[string]int) string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s: %d", k, v))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
