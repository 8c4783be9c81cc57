package dockeripam_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/test/lab/testutil"
)

func TestValidateNetworkName(t *testing.T) {
	for _, tc := range []struct {
		template string
		wantErr  string // "" for valid
	}{
		{"{overlay}", ""},
		{"d-{overlay}", ""},
		{"carve_{overlay}.net", ""},
		{"dcos", "containing {overlay}"},
		{"", "containing {overlay}"},
		{"-{overlay}", "not a Docker network name"},
		{"a b{overlay}", "not a Docker network name"},
		{"{overlay}/x", "not a Docker network name"},
		{strings.Repeat("x", 52) + "{overlay}", "longer than 64"},
	} {
		err := dockeripam.ValidateNetworkName(tc.template)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("ValidateNetworkName(%q) = %v; want an error containing %q", tc.template, err, tc.wantErr)
		}
	}
	if _, err := dockeripam.New(newTestService(t), dockeripam.Options{NetworkName: "dcos"}); err == nil {
		t.Error("New accepted a template without {overlay}")
	}
}

// TestEngineNetworkNameTemplate: a configured template names the networks;
// the bridge stays d-<overlay>.
func TestEngineNetworkNameTemplate(t *testing.T) {
	e := startFakeEngine(t)
	s := runService(t, newTestService(t), dockeripam.Options{DockerHost: e.host(), NetworkName: "docker-{overlay}", GCInterval: time.Hour})
	testutil.Eventually(t, waitLimit, "both networks ok", testutil.True(func() bool {
		return networkState(s, "carve").State == dockeripam.NetworkOK && networkState(s, "blue").State == dockeripam.NetworkOK
	}))
	if got := e.names(); !slices.Equal(got, []string{"docker-blue", "docker-carve"}) {
		t.Errorf("networks %v", got)
	}
	for _, b := range e.createBodies() {
		opts, _ := b["Options"].(map[string]any)
		ov := strings.TrimPrefix(b["Name"].(string), "docker-")
		if opts["com.docker.network.bridge.name"] != "d-"+ov {
			t.Errorf("network %s on bridge %v, want d-%s", b["Name"], opts["com.docker.network.bridge.name"], ov)
		}
	}
	if st := networkState(s, "carve"); st.Name != "docker-carve" {
		t.Errorf("status names %q", st.Name)
	}
}

// legacyNetwork is the network an older carve created for overlay carve.
func legacyNetwork() map[string]any {
	return map[string]any{"Name": "d-carve", "Id": "legacy-id", "Driver": "bridge",
		"IPAM":    map[string]any{"Driver": "carve", "Options": map[string]any{"network": "carve"}, "Config": []any{map[string]any{"Subnet": "10.128.0.128/25", "Gateway": "10.128.0.129"}}},
		"Labels":  map[string]any{"net.carve.overlay": "carve"},
		"Options": map[string]any{"com.docker.network.bridge.name": "d-carve"}}
}

// TestEngineMigratesLegacyNetwork: the d-<overlay> network of an older
// carve is removed and created under the new name when no container uses
// it; while containers do, it stays (and says so) and is migrated once they
// are gone. A d-<overlay> network that is not carve's is never removed.
func TestEngineMigratesLegacyNetwork(t *testing.T) {
	t.Run("unused", func(t *testing.T) {
		e := startFakeEngine(t)
		e.setNetwork(legacyNetwork())
		s := runService(t, newTestService(t), dockeripam.Options{DockerHost: e.host(), GCInterval: time.Hour})
		testutil.Eventually(t, waitLimit, "carve ok", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))
		if got := e.names(); !slices.Equal(got, []string{"blue", "carve"}) {
			t.Errorf("networks %v, want the legacy d-carve replaced by carve", got)
		}
	})
	t.Run("in use", func(t *testing.T) {
		e := startFakeEngine(t)
		e.setNetwork(legacyNetwork())
		e.attach("d-carve", "c1", "10.128.0.130/25")
		s := runService(t, newTestService(t), dockeripam.Options{DockerHost: e.host(), GCInterval: time.Hour, SyncInterval: 20 * time.Millisecond})
		testutil.Eventually(t, waitLimit, "carve legacy", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkLegacy }))
		st := networkState(s, "carve")
		wantContains(t, "legacy status", st.Error, "d-carve of an older carve still has 1 containers", "replaces it by carve")
		if got := e.names(); !slices.Equal(got, []string{"blue", "d-carve"}) {
			t.Errorf("networks %v, want d-carve left alone while in use", got)
		}
		e.detach("d-carve", "c1")
		testutil.Eventually(t, waitLimit, "carve migrated", testutil.True(func() bool { return networkState(s, "carve").State == dockeripam.NetworkOK }))
		if got := e.names(); !slices.Equal(got, []string{"blue", "carve"}) {
			t.Errorf("networks %v after the containers left", got)
		}
	})
	t.Run("not carve's", func(t *testing.T) {
		e := startFakeEngine(t)
		n := legacyNetwork()
		delete(n, "Labels")
		e.setNetwork(n)
		s := runService(t, newTestService(t), dockeripam.Options{DockerHost: e.host(), GCInterval: time.Hour})
		testutil.Eventually(t, waitLimit, "carve checked", testutil.True(func() bool { return networkState(s, "carve").State != "" }))
		if got := e.names(); !slices.Contains(got, "d-carve") {
			t.Errorf("networks %v: a d-carve network carve did not create was removed", got)
		}
	})
	t.Run("legacy name configured", func(t *testing.T) {
		e := startFakeEngine(t)
		e.setNetwork(legacyNetwork())
		s := runService(t, newTestService(t), dockeripam.Options{DockerHost: e.host(), NetworkName: "d-{overlay}", GCInterval: time.Hour})
		testutil.Eventually(t, waitLimit, "d-carve ok", testutil.True(func() bool { return networkState(s, "carve").State != "" }))
		if got := e.names(); !slices.Equal(got, []string{"d-blue", "d-carve"}) || len(e.removed()) != 0 {
			t.Errorf("networks %v, removed %v: with --docker-network-name d-{overlay} the network stays", got, e.removed())
		}
	})
}
