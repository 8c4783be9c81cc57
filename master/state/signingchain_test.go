package state

import (
	"crypto/ed25519"
	"encoding/json"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestSetSigningServesTheChain: a new key and chain wake the watchers and
// show in the state, its JSON and the changes (re-signed); a chain whose
// link does not verify is refused and changes nothing.
func TestSetSigningServesTheChain(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	oldPub, oldKey, _ := ed25519.GenerateKey(nil)
	newPub, newKey, _ := ed25519.GenerateKey(nil)
	h.table.SetSigningKey(oldKey)
	h.apply(command{Op: opSetClusterID, ClusterID: "c1"})
	h.mustRegister("a1", "198.18.0.1")
	chain := &api.SigningChain{Links: []api.SigningLink{api.NewSigningLink(oldKey, newPub)}}

	changed, _ := h.table.Changed()
	gen := h.table.SigningGeneration()
	if err := h.table.SetSigning(newKey, chain); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("SetSigning did not wake the watchers")
	}
	if h.table.SigningGeneration() == gen {
		t.Error("SetSigning left the signing generation")
	}
	st := h.table.State()
	if st.SigningKey != api.EncodeSigningKey(newPub) || st.SigningChain == nil || !st.SigningChain.Reaches(oldPub, newPub) {
		t.Errorf("state: key %s chain %+v, want the new key and a chain from the old", st.SigningKey, st.SigningChain)
	}
	for _, a := range st.Agents {
		if err := api.VerifyRecord(newPub, &a, "c1"); err != nil {
			t.Errorf("record not re-signed with the new key: %v", err)
		}
	}
	for name, read := range map[string]func() ([]byte, error){
		"state JSON":   func() ([]byte, error) { b, _, err := h.table.StateJSON(""); return b, err },
		"changes JSON": func() ([]byte, error) { b, _, err := h.table.ChangesJSON(0); return b, err },
	} {
		b, err := read()
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			SigningKey   string            `json:"signing_key"`
			SigningChain *api.SigningChain `json:"signing_chain"`
			Agents       []api.AgentInfo   `json:"agents"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.SigningKey != st.SigningKey || got.SigningChain == nil || len(got.SigningChain.Links) != 1 || got.SigningChain.Links[0] != chain.Links[0] {
			t.Errorf("%s: key %s chain %+v", name, got.SigningKey, got.SigningChain)
		}
		for _, a := range got.Agents {
			if err := api.VerifyRecord(newPub, &a, "c1"); err != nil {
				t.Errorf("%s: a record not re-signed: %v", name, err)
			}
		}
	}

	// A forged link: refused, the key and chain stay.
	forged := api.NewSigningLink(newKey, oldPub)
	forged.Signature = chain.Links[0].Signature
	if err := h.table.SetSigning(oldKey, &api.SigningChain{Links: []api.SigningLink{forged}}); err == nil {
		t.Error("a chain with a forged link was taken")
	}
	if st := h.table.State(); st.SigningKey != api.EncodeSigningKey(newPub) {
		t.Error("a refused chain changed the key")
	}
	// The chain dropped.
	if err := h.table.SetSigning(newKey, nil); err != nil {
		t.Fatal(err)
	}
	if st := h.table.State(); st.SigningChain != nil {
		t.Errorf("the chain is still served: %+v", st.SigningChain)
	}
}
