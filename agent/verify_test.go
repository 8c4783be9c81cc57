package agent

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/carve-net/carve/api"
)

func TestKeyAfter(t *testing.T) {
	k1, _ := testKey(t)
	k2, _ := testKey(t)
	state := func(k ed25519.PublicKey) *api.State {
		st := &api.State{ClusterID: "c1", Index: 7}
		if k != nil {
			st.SigningKey = api.EncodeSigningKey(k)
		}
		return st
	}
	tests := []struct {
		name                string
		configured, pinned  ed25519.PublicKey
		st                  *api.State
		rebuilt, allowPlain bool
		want                ed25519.PublicKey
		wantErr             error
	}{
		{"first state: pinned", nil, nil, state(k1), false, false, k1, nil},
		{"same key", nil, k1, state(k1), false, false, k1, nil},
		{"another key in the same cluster", nil, k1, state(k2), false, false, nil, errStateKey},
		{"another key in a rebuilt cluster", nil, k1, state(k2), true, false, k2, nil},
		{"configured key", k1, nil, state(k1), false, false, k1, nil},
		{"configured key, masters sign with another", k1, nil, state(k2), false, false, nil, errStateKey},
		{"configured key, rebuilt cluster with another", k1, k1, state(k2), true, false, nil, errStateKey},
		{"malformed key", nil, nil, &api.State{ClusterID: "c1", SigningKey: "bm90IGEga2V5"}, false, false, nil, errStateKey},
		{"unsigned over TLS", nil, nil, state(nil), false, false, nil, errStateUnsigned},
		{"unsigned, --insecure plain http", nil, nil, state(nil), false, true, nil, nil},
		{"unsigned with a configured key", k1, nil, state(nil), false, true, nil, errStateUnsigned},
		{"unsigned after signed, same cluster", nil, k1, state(nil), false, true, nil, errStateUnsigned},
		{"unsigned rebuilt cluster, --insecure plain http", nil, k1, state(nil), true, true, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := keyAfter(tt.configured, tt.pinned, tt.st, tt.rebuilt, tt.allowPlain)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("keyAfter: %v, want %v", err, tt.wantErr)
			}
			if !got.Equal(tt.want) && !(got == nil && tt.want == nil) {
				t.Errorf("key %v, want %v", got, tt.want)
			}
		})
	}
}
