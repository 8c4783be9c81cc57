package agent

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/carve-net/carve/api"
)

func TestKeyAfter(t *testing.T) {
	k1, k1priv := testKey(t)
	k2, k2priv := testKey(t)
	k3, _ := testKey(t)
	_, otherPriv := testKey(t)
	state := func(k ed25519.PublicKey, links ...api.SigningLink) *api.State {
		st := &api.State{ClusterID: "c1", Index: 7}
		if k != nil {
			st.SigningKey = api.EncodeSigningKey(k)
		}
		if len(links) > 0 {
			st.SigningChain = &api.SigningChain{Links: links}
		}
		return st
	}
	link12, link23 := api.NewSigningLink(k1priv, k2), api.NewSigningLink(k2priv, k3)
	forged := api.NewSigningLink(otherPriv, k2) // signed by another key, naming k1 as previous
	forged.Previous = api.EncodeSigningKey(k1)
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
		// Issue 19, item 7: a new cluster id is no licence for a new key.
		{"another key in a rebuilt cluster", nil, k1, state(k2), true, false, nil, errStateKey},
		{"a new key through the chain", nil, k1, state(k2, link12), false, false, k2, nil},
		{"a new key through two links", nil, k1, state(k3, link23, link12), false, false, k3, nil},
		{"a new key through the chain, rebuilt cluster", nil, k1, state(k2, link12), true, false, k2, nil},
		{"a master not switched yet: the newer key stays", nil, k2, state(k1, link12), false, false, k2, nil},
		{"a chain that does not lead from the trusted key", nil, k3, state(k2, link12), false, false, nil, errStateKey},
		{"a forged link", nil, k1, state(k2, forged), false, false, nil, errStateKey},
		{"a chain backwards is no licence", nil, k2, state(k3, link12), false, false, nil, errStateKey},
		{"configured key, a new key through the chain", k1, k1, state(k2, link12), false, false, k2, nil},
		{"configured key, followed before", k1, k2, state(k2), false, false, k2, nil},
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
