package encryption

import (
	"context"
	"errors"
	"testing"
)

// fakeRegistrar is the agent's registration as a rotation sees it: the
// masters sign what is registered, or (refuse) nothing.
type fakeRegistrar struct {
	w      *WireGuard
	refuse bool
	signed string
	calls  int
}

func (r *fakeRegistrar) Register(context.Context) {
	r.calls++
	if !r.refuse {
		r.signed = r.w.RegisterKey()
	}
}

func (r *fakeRegistrar) RegisteredKey() string { return r.signed }

// TestRotate: a rotation registers its new key and answers once the
// masters signed it; one they do not sign in time fails and stays
// pending (the next registration sends it); an agent without a key says
// so with ErrDisabled and registers nothing.
func TestRotate(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		refuse   bool
		wantErr  error // nil: succeeds
		fails    bool
		calls    int
		pendings int // rotations' keys still pending after it
	}{
		{name: "signed", calls: 1, pendings: 1},
		{name: "not signed in time", refuse: true, fails: true, calls: 1, pendings: 1},
		{name: "--wireguard=false", cfg: Config{Disabled: true}, wantErr: ErrDisabled, fails: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWireGuard(t, tt.cfg)
			before := w.RegisterKey()
			reg := &fakeRegistrar{w: w, refuse: tt.refuse}
			st, err := w.Rotate(context.Background(), reg)
			if (err != nil) != tt.fails || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("Rotate: %v, want failure %v (%v)", err, tt.fails, tt.wantErr)
			}
			if reg.calls != tt.calls {
				t.Errorf("registered %d times, want %d", reg.calls, tt.calls)
			}
			if len(w.pending) != tt.pendings {
				t.Errorf("%d keys pending, want %d", len(w.pending), tt.pendings)
			}
			if tt.cfg.Disabled {
				return
			}
			after := w.RegisterKey()
			if after == before {
				t.Errorf("registers the key of before the rotation, %s", before)
			}
			if err == nil && (st.RegisteredKey != after || st.PublicKey != after) {
				t.Errorf("status: registered %s, holds %s; want both %s", st.RegisteredKey, st.PublicKey, after)
			}
			// The signed record reaches the plan: the new key is this
			// agent's, and nothing stays pending.
			if k, ok := w.ownKey(after); !ok || k.PublicKey().String() != after || len(w.pending) != 0 {
				t.Errorf("with the new key signed: ok %v, %d pending", ok, len(w.pending))
			}
		})
	}
}
