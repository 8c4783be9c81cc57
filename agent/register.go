package agent

// Registration with the masters, and the agent's own record they answer.

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/buildinfo"
	"github.com/carve-net/carve/internal/retry"
)

// registerLoop registers, retrying with backoff, and again whenever the
// masters show this agent deleted.
func (a *Agent) registerLoop(ctx context.Context) {
	for {
		a.register(ctx)
		select {
		case <-ctx.Done():
			return
		case <-a.reregisterCh:
			a.log.Warn("the masters no longer have this agent: registering again")
		}
	}
}

func (a *Agent) register(ctx context.Context) {
	hostname := a.cfg.Hostname
	if hostname == "" {
		hostname, _ = os.Hostname()
	}
	req := api.RegisterRequest{
		AgentID: a.id, Hostname: hostname, IP: a.ip.String(), MeshAddr: a.cfg.MeshAddr,
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: a.cfg.MesosBridge, DockerBridge: a.cfg.DockerBridge},
		RequestID:     api.NewRequestID(),
		UnderlayMTU:   a.refreshUnderlayMTU(),
		Keys:          api.AgentKeys{Claim: base64.StdEncoding.EncodeToString(a.claimKey.Public().(ed25519.PublicKey))},
		CarveVersion:  buildinfo.Get().Version,
	}
	wgKey, hasWG := a.wg.RegisterKeyPair()
	if hasWG {
		req.Keys.WireGuard = wgKey.PublicKey().String()
		req.WireGuardProofs = a.wireGuardProofs(wgKey, a.knownSigningKeys())
	}
	b := retry.Backoff{First: firstRetry, Max: maxRetry}
	explained := false // a TLS mismatch was logged as an error
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		info, err := a.client.Register(rctx, req)
		cancel()
		if hasWG && a.proveAgainstAskedKey(&req, wgKey, err) {
			continue // the master named the signing key to prove against
		}
		if err == nil {
			a.metrics.registrations.WithLabelValues("ok").Inc()
			a.log.Info("registered", "version", info.Version, "overlays", len(info.Overlays))
			a.mu.Lock()
			a.registered = true
			a.mu.Unlock()
			a.updateSelf(info)
			return
		}
		a.metrics.registrations.WithLabelValues("error").Inc()
		wait := b.Next()
		if !api.IsRetryable(err) {
			// A definite answer ends this request: the masters may
			// remember its id and give the same answer to it for ever (a
			// registration that committed, then its agent was deleted, is
			// answered "deleted"). The next attempt is a new request.
			req.RequestID = api.NewRequestID()
			if !api.IsCode(err, api.CodeNotFound) {
				// A refusal (bad input, VTEP IPs exhausted) will not fix
				// itself quickly, but the operator may free space: keep
				// trying, slowly. "Not found" (deleted meanwhile) is
				// answered by registering again, at the usual pace.
				wait = maxRetry
			}
		}
		if why := explainMasterError(err, a.cfg.TLS); why != "" {
			// A TLS or scheme mismatch: retrying does not fix it, the
			// operator must. Said plainly, as an error the first time.
			level := slog.LevelWarn
			if !explained {
				level, explained = slog.LevelError, true
			}
			a.log.Log(ctx, level, "registration failed: "+why+"; working from the last known state", "err", err, "retry_in", maxRetry)
			// The fix is the operator's: new TLS files, reloaded, end
			// the wait.
			if !a.sec.sleepUntilReload(ctx, maxRetry) {
				return
			}
			continue
		}
		a.log.Warn("registration failed; working from the last known state", "err", err, "retry_in", wait.Round(time.Millisecond))
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// knownSigningKeys are the masters' record-signing keys this agent knows:
// the one it verifies with (configured, pinned or followed through the
// chain), then those the chain still leads from; none before the first
// master state of an agent without --signing-pub-file.
func (a *Agent) knownSigningKeys() []ed25519.PublicKey {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var keys []ed25519.PublicKey
	if a.signingKey != nil {
		keys = append(keys, a.signingKey)
	}
	for _, k := range a.previousKeys {
		if !slices.ContainsFunc(keys, func(x ed25519.PublicKey) bool { return x.Equal(k) }) {
			keys = append(keys, k)
		}
	}
	return keys
}

// wireGuardProofs prove to the masters that sign with each of keys (at
// most api.MaxWireGuardProofs of them) that this agent holds wgKey
// (api/wgproof.go): during a rotation of their signing key, masters may
// sign with either.
func (a *Agent) wireGuardProofs(wgKey wgtypes.Key, keys []ed25519.PublicKey) []api.WireGuardProof {
	var proofs []api.WireGuardProof
	for _, k := range keys[:min(len(keys), api.MaxWireGuardProofs)] {
		p, err := api.ProveWireGuardKey(wgKey, a.id, k)
		if err != nil {
			a.log.Warn("no wireguard proof of possession against a signing key", "key", api.SigningKeyFingerprint(k), "err", err)
			continue
		}
		proofs = append(proofs, p)
	}
	return proofs
}

// proveAgainstAskedKey adds to req, after a master's 403 wireguard_proof
// that names its signing key (api.Error.SigningKey), a proof against that
// key, and tells whether to register again at once: an agent that knows
// no signing key yet (no --signing-pub-file, before the first master
// state), or not the one a master switched to in a rotation, learns it
// here. Proving against any key reveals nothing of the WireGuard key, so
// the key need not be trusted; it is never used to verify anything. A key
// proven already goes on to the usual backoff.
func (a *Agent) proveAgainstAskedKey(req *api.RegisterRequest, wgKey wgtypes.Key, err error) bool {
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeWireGuardProof || e.SigningKey == "" {
		return false
	}
	key, perr := api.ParseSigningKey(e.SigningKey)
	if perr != nil || slices.ContainsFunc(req.WireGuardProofs, func(p api.WireGuardProof) bool { return p.SigningKey == e.SigningKey }) {
		return false
	}
	proof, perr := api.ProveWireGuardKey(wgKey, a.id, key)
	if perr != nil {
		return false
	}
	if len(req.WireGuardProofs) >= api.MaxWireGuardProofs {
		req.WireGuardProofs = req.WireGuardProofs[1:]
	}
	req.WireGuardProofs = append(slices.Clip(req.WireGuardProofs), proof)
	req.RequestID = api.NewRequestID() // the refusal was a definite answer to the last one
	a.log.Info("registering again with a wireguard proof against the master's signing key", "key", api.SigningKeyFingerprint(key))
	return true
}

// reclaimIP registers again when the masters' record of this agent lost its
// underlay IP (another registration took it: the masters accept only an IP
// the registering agent's certificate names, so an operator's or a
// misissued certificate's): without it, every host drops this one's FDB
// entries and routes. At most once per maxRetry, so that two agents whose
// certificates both name the IP do not take it from each other in a loop.
func (a *Agent) reclaimIP(mine *api.AgentInfo) {
	if mine.HasIP() || !a.ip.IsValid() {
		return
	}
	a.mu.Lock()
	due := a.registered && time.Since(a.lostIPAt) >= maxRetry
	if due {
		a.lostIPAt = time.Now()
	}
	a.mu.Unlock()
	if !due {
		return
	}
	a.metrics.lostIP.Inc()
	a.log.Warn("the masters' record of this agent has no underlay IP (another registration took it): registering again with its own", "ip", a.ip, "version", mine.Version)
	a.trigger(a.reregisterCh)
}

// updateSelf records a newer own record, from the masters. The agent
// programs itself from it (the masters are authenticated by TLS); it joins
// the membership, and is gossiped, only when it verifies as any other
// record must. A registration answer read before the first master state
// cannot be verified yet (no cluster id, maybe no key): the state, which
// carries the same record, brings it in.
func (a *Agent) updateSelf(info *api.AgentInfo) {
	rec := membership.NewPeerRecord(info)
	a.mu.Lock()
	if a.self != nil && a.self.Version > info.Version {
		a.mu.Unlock()
		return
	}
	// The same record again (every watch wake-up brings it): nothing to
	// store, program or gossip.
	if a.self != nil && a.self.Version == info.Version && jsonEqual(a.self, info) && a.members.Holds(&rec) {
		a.mu.Unlock()
		return
	}
	a.self = info
	tr := a.trustLocked()
	a.mu.Unlock()
	a.trigger(a.persistCh)
	a.trigger(a.reconcileCh)
	st := membership.State{Records: []membership.PeerRecord{rec}}
	in, refused := tr.Admit(tr.ClusterID, st, a.members)
	if len(refused) > 0 {
		if tr.ClusterID == "" || (tr.Required && tr.Key == nil) {
			a.log.Debug("own record not gossiped until the first master state", "version", info.Version)
		} else {
			a.countRefused(a.metrics.masterRefused, "the masters' record of this agent", refused)
		}
		return
	}
	// Under the lock, as gossip: a rebuild in between must not let a record
	// of the old cluster into the new one's membership.
	a.mu.RLock()
	current := a.clusterID == tr.ClusterID
	if current {
		a.members.MergeFromMasters(in)
	}
	a.mu.RUnlock()
	if current {
		a.channel.Broadcast(a.gossipData(st))
	}
}
