package agent

// Checking what the agent is told: the masters' signing key it verifies
// with (pinned or given), the checks records and tombstones pass
// (membership.Trust), and the counting and logging of what fails.

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
)

// trustLocked is what records are checked against now (a.mu held). With
// TLS to the masters, or once a key is known, signatures are required;
// only --insecure with plain http masters that sign nothing goes without.
func (a *Agent) trustLocked() membership.Trust {
	return membership.Trust{ClusterID: a.clusterID, Key: a.signingKey, Required: a.signingKey != nil || a.sec.client != nil, Network: a.network}
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
// against the cluster CA), and is then pinned in the agent's store: a state
// carrying another key is refused, unless it is of a rebuilt cluster
// (another cluster id). Only an agent that runs --insecure against plain
// http masters that sign nothing goes without: it logs a warning and checks
// the ranges alone.

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
// given the key of --signing-pub-file (configured), the pinned one, whether
// st is of a rebuilt cluster (another cluster id), and whether unsigned
// states are allowed (--insecure with plain http masters). An error
// (errStateKey, errStateUnsigned) refuses the state.
func keyAfter(configured, pinned ed25519.PublicKey, st *api.State, rebuilt, unsignedAllowed bool) (ed25519.PublicKey, error) {
	if st.SigningKey == "" {
		switch {
		case configured != nil:
			return nil, fmt.Errorf("%w: --signing-pub-file is given (key %s), but the masters sign nothing (start them with --signing-key-file)", errStateUnsigned, keyFingerprint(configured))
		case !unsignedAllowed:
			return nil, fmt.Errorf("%w: the masters sign nothing, and an agent that talks TLS to them requires signed records (start the masters with --signing-key-file)", errStateUnsigned)
		case pinned != nil && !rebuilt:
			return nil, fmt.Errorf("%w: the masters signed with key %s before and sign nothing now (cluster %s)", errStateUnsigned, keyFingerprint(pinned), st.ClusterID)
		}
		return nil, nil
	}
	key, err := api.ParseSigningKey(st.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStateKey, err)
	}
	switch {
	case configured != nil && !key.Equal(configured):
		return nil, fmt.Errorf("%w: the masters sign with key %s, --signing-pub-file holds %s", errStateKey, keyFingerprint(key), keyFingerprint(configured))
	case configured != nil:
		return configured, nil
	case pinned != nil && !key.Equal(pinned) && !rebuilt:
		return nil, fmt.Errorf("%w: the masters sign with key %s, this agent pinned %s from the first state of cluster %s it read; "+
			"if the masters' key was replaced on purpose, give this agent --signing-pub-file with the new signing.pub", errStateKey, keyFingerprint(key), keyFingerprint(pinned), st.ClusterID)
	}
	return key, nil
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

// keyFingerprint names a public key in logs: the first bytes of its SHA-256.
func keyFingerprint(k ed25519.PublicKey) string {
	sum := sha256.Sum256(k)
	return "sha256:" + hex.EncodeToString(sum[:8])
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
