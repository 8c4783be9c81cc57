package agent

// Checking what the agent is told: the masters' signing key it verifies
// with (pinned or given), the checks records and tombstones pass
// (membership.Trust), and the counting and logging of what fails.

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
)

// trustLocked is what records are checked against now (a.mu held). With
// TLS to the masters, or once a key is known, signatures are required;
// only --insecure with plain http masters that sign nothing goes without.
func (a *Agent) trustLocked() membership.Trust {
	return membership.Trust{ClusterID: a.clusterID, Key: a.signingKey, Previous: a.previousKeys,
		Required: a.signingKey != nil || a.sec.client != nil, Network: a.network, Revoked: a.revoked}
}

// countRefused counts refused records and tombstones and logs them, at
// most once a minute per reason and source.
func (a *Agent) countRefused(counter *prometheus.CounterVec, source string, refused []membership.Refusal) {
	for _, r := range refused {
		counter.WithLabelValues(r.Reason).Inc()
		level := slog.LevelDebug
		if a.refusals.allow(source + "/" + r.Reason) {
			level = slog.LevelWarn
		}
		a.log.Log(context.Background(), level, "refused a record or tombstone of "+source, "reason", r.Reason, "err", r.Err)
	}
}

// The masters' signing key comes from --signing-pub-file, or else from
// the first master state read (over TLS, whose certificate was verified
// against the cluster CA), and is then pinned in the agent's store. A state
// carrying another key is refused, whatever its cluster id, unless the
// masters' signing key chain (api.SigningChain) leads to it from the key
// the agent trusts: then the agent follows it, with no restart, and pins
// the new key. A state signed with a key the chain leads from (a master
// that has not switched yet) is taken, and the agent keeps the newer key.
// Only an agent that runs --insecure against plain http masters that sign
// nothing goes without: it logs a warning and checks the ranges alone.

// Reasons a whole master state is refused (carve_agent_master_states_refused_total).
const (
	stateRefusedKey      = "signing_key"
	stateRefusedUnsigned = "unsigned"
)

// Errors of keyAfter, by the reason they are counted under.
var (
	errStateKey      = errors.New("refusing the masters' state: its signing key is not the one this agent trusts")
	errStateUnsigned = errors.New("refusing the masters' state: it is unsigned")
)

// keyAfter is the verification key that holds after a master state st,
// given the key of --signing-pub-file (configured), the one the agent
// verifies with now (trusted: pinned, configured, or followed through a
// chain), whether st is of a rebuilt cluster (another cluster id), and
// whether unsigned states are allowed (--insecure with plain http masters).
// An error (errStateKey, errStateUnsigned) refuses the state.
func keyAfter(configured, trusted ed25519.PublicKey, st *api.State, rebuilt, unsignedAllowed bool) (ed25519.PublicKey, error) {
	if st.SigningKey == "" {
		switch {
		case configured != nil:
			return nil, fmt.Errorf("%w: --signing-pub-file is given (key %s), but the masters sign nothing (start them with --signing-key-file)", errStateUnsigned, api.SigningKeyFingerprint(configured))
		case !unsignedAllowed:
			return nil, fmt.Errorf("%w: the masters sign nothing, and an agent that talks TLS to them requires signed records (start the masters with --signing-key-file)", errStateUnsigned)
		case trusted != nil && !rebuilt:
			return nil, fmt.Errorf("%w: the masters signed with key %s before and sign nothing now (cluster %s)", errStateUnsigned, api.SigningKeyFingerprint(trusted), st.ClusterID)
		}
		return nil, nil
	}
	key, err := api.ParseSigningKey(st.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStateKey, err)
	}
	if trusted == nil {
		trusted = configured
	}
	switch {
	case trusted == nil, key.Equal(trusted):
		return key, nil
	case st.SigningChain.Reaches(trusted, key):
		return key, nil
	case slices.ContainsFunc(st.SigningChain.Previous(trusted), func(k ed25519.PublicKey) bool { return k.Equal(key) }):
		return trusted, nil
	case configured != nil && trusted.Equal(configured):
		return nil, fmt.Errorf("%w: the masters sign with key %s, --signing-pub-file holds %s, and no signing key chain of theirs leads from it to theirs; "+
			"if the masters' key was replaced on purpose, give this agent the new signing.pub", errStateKey, api.SigningKeyFingerprint(key), api.SigningKeyFingerprint(configured))
	}
	return nil, fmt.Errorf("%w: the masters sign with key %s, this agent trusts %s (pinned from the masters' state of cluster %s or followed through their chain) "+
		"and no signing key chain of theirs leads from it to theirs; if the masters' key was replaced on purpose (a rebuilt cluster, a lost key), "+
		"give this agent --signing-pub-file with the new signing.pub", errStateKey, api.SigningKeyFingerprint(key), api.SigningKeyFingerprint(trusted), st.ClusterID)
}

// verifyRestore checks the signature of a restore the agent is to follow
// (none to check when the masters sign nothing: key nil); the error
// refuses the state, as a key it does not trust does.
func verifyRestore(key ed25519.PublicKey, st *api.State) error {
	if key == nil || st.Restore == nil {
		return nil
	}
	if err := api.VerifyRestore(key, *st.Restore, st.ClusterID); err != nil {
		return fmt.Errorf("%w: %w", errStateKey, err)
	}
	return nil
}

// logLimiter lets a kind of message through once per interval, so that
// what a rogue peer or a misconfigured master repeats does not flood the log.
type logLimiter struct {
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
}

func newLogLimiter(interval time.Duration) *logLimiter {
	return &logLimiter{interval: interval, last: map[string]time.Time{}}
}

// allow tells whether a message of this kind may be logged now.
func (l *logLimiter) allow(kind string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if t, ok := l.last[kind]; ok && now.Sub(t) < l.interval {
		return false
	}
	l.last[kind] = now
	return true
}

// Refusing the masters. An agent that cannot verify what it is given (a
// signing key it does not follow, records of the masters' state or saved
// records that do not verify, a format it cannot read) keeps its kernel as
// it is: the peers it cannot verify now were verified when it programmed
// them, and an agent that removed them would cut its containers off for as
// long as it refuses. What it refuses from the masters never enters its
// membership (the records it had stay); the saved records it refuses at
// start are kept aside (unverified) and programmed with the membership
// until a whole master state was taken with every record verified
// (setRefusing("")), and nothing is saved meanwhile (persist.go). It
// reports the refusal: carve_agent_refusing_masters, its report to the
// masters (carve cluster status), a log line at most once a minute.

// maxRefusing bounds the reported refusal (the masters take 1,024 bytes).
const maxRefusing = 1000

// setRefusing records why the agent refuses the masters ("": it holds a
// verified state again) and has it reported; a change wakes the reconcile,
// which reports (and, once it is "", programs the kernel).
func (a *Agent) setRefusing(why string) {
	why = truncate(why, maxRefusing)
	a.mu.Lock()
	was := a.refusing
	a.refusing = why
	a.mu.Unlock()
	switch {
	case why != "":
		a.metrics.refusing.Set(1)
		level := slog.LevelDebug
		if a.refusals.allow("refusing the masters") {
			level = slog.LevelError
		}
		a.log.Log(context.Background(), level, "refusing the masters' records: keeping the kernel as it is until a verified state", "why", why)
	case was != "":
		a.mu.Lock()
		a.unverified = membership.State{} // the masters' state replaces them
		a.mu.Unlock()
		a.metrics.refusing.Set(0)
		a.log.Info("the masters' state verifies again: programming the kernel from it", "was_refusing", was)
		a.trigger(a.persistCh) // nothing was saved while refusing
	}
	if why != was {
		a.trigger(a.reconcileCh)
	}
}

// refusingNow tells why the agent refuses the masters ("": it does not).
func (a *Agent) refusingNow() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.refusing
}

// signatureRefusals is a summary of the refusals of records or tombstones
// that did not verify (unsigned, a bad signature, another cluster), "" when
// none: what makes the agent refuse the masters. Refusals of a record out
// of range or of a revoked agent are of that record alone.
func signatureRefusals(what string, refused []membership.Refusal) string {
	n, first := 0, error(nil)
	for _, r := range refused {
		switch r.Reason {
		case membership.RefusedUnsigned, membership.RefusedBadSignature, membership.RefusedOtherCluster:
			if n == 0 {
				first = r.Err
			}
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d records or tombstones of %s do not verify (first: %v)", n, what, first)
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// unverifiedOf is the records of the saved membership that members,
// loaded from it with the checks, does not hold: those refused.
func unverifiedOf(saved membership.State, members *membership.Membership) membership.State {
	var out membership.State
	for _, r := range saved.Records {
		if _, ok := members.Record(r.ID); !ok {
			out.Records = append(out.Records, r)
		}
	}
	return out
}

// withUnverified is the membership to program: members, and the refused
// saved records of agents it holds nothing of (neither a record nor a
// tombstone).
func withUnverified(members, unverified membership.State) membership.State {
	if len(unverified.Records) == 0 {
		return members
	}
	held := make(map[string]bool, len(members.Records)+len(members.Tombstones))
	for _, r := range members.Records {
		held[r.ID] = true
	}
	for _, t := range members.Tombstones {
		held[t.AgentID] = true
	}
	out := membership.State{Records: slices.Clone(members.Records), Tombstones: members.Tombstones}
	for _, r := range unverified.Records {
		if !held[r.ID] {
			out.Records = append(out.Records, r)
		}
	}
	return out
}
