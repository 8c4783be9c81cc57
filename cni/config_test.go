package cni

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name     string
		stdin    string
		wantCode uint   // 0: success
		wantMsg  string // in the error message
		want     *Config
	}{
		{
			name:  "defaults",
			stdin: `{"cniVersion":"1.1.0","name":"carve","type":"bridge","ipam":{"type":"carve-ipam","network":"carve"}}`,
			want:  &Config{CNIVersion: "1.1.0", Name: "carve", Network: "carve", Bridge: "mesos", Socket: netconf.DefaultSocket},
		},
		{
			name:  "everything set, unknown keys tolerated",
			stdin: `{"cniVersion":"1.0.0","name":"n","ipam":{"type":"carve-ipam","network":"ov-1","bridge":"docker","socket":"/tmp/a.sock","future":1},"other":true}`,
			want:  &Config{CNIVersion: "1.0.0", Name: "n", Network: "ov-1", Bridge: "docker", Socket: "/tmp/a.sock"},
		},
		{
			name:  "GC attachments",
			stdin: `{"cniVersion":"1.1.0","name":"n","ipam":{"network":"ov"},"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":""}]}`,
			want: &Config{CNIVersion: "1.1.0", Name: "n", Network: "ov", Bridge: "mesos", Socket: netconf.DefaultSocket, HasAttachments: true,
				ValidAttachments: []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}, {ContainerID: "c2"}}},
		},
		{
			name:  "GC attachments null (no live container) is an empty list",
			stdin: `{"cniVersion":"1.1.0","name":"n","ipam":{"network":"ov"},"cni.dev/valid-attachments":null}`,
			want:  &Config{CNIVersion: "1.1.0", Name: "n", Network: "ov", Bridge: "mesos", Socket: netconf.DefaultSocket, HasAttachments: true},
		},
		{
			name:  "GC attachments under the legacy key",
			stdin: `{"cniVersion":"1.1.0","name":"n","ipam":{"network":"ov"},"cni.dev/attachments":[]}`,
			want:  &Config{CNIVersion: "1.1.0", Name: "n", Network: "ov", Bridge: "mesos", Socket: netconf.DefaultSocket, HasAttachments: true, ValidAttachments: []types.GCAttachment{}},
		},
		{name: "not JSON", stdin: `{"ipam":`, wantCode: types.ErrDecodingFailure, wantMsg: "decode network configuration"},
		{name: "no ipam section", stdin: `{"cniVersion":"1.1.0","name":"n"}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: `no "ipam" section`},
		{name: "ipam not an object", stdin: `{"ipam":"carve"}`, wantCode: types.ErrDecodingFailure, wantMsg: "decode"},
		{name: "missing network", stdin: `{"ipam":{"type":"carve-ipam"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.network is missing"},
		{name: "invalid network", stdin: `{"ipam":{"network":"Carve/x"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.network"},
		{name: "reserved network", stdin: `{"ipam":{"network":"none"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "reserved"},
		{name: "network too long for m-<network>", stdin: `{"ipam":{"network":"abcdefghijklmn"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "1-13 characters"},
		{name: "wrong type", stdin: `{"ipam":{"type":"host-local","network":"ov"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.type"},
		{name: "bad bridge", stdin: `{"ipam":{"network":"ov","bridge":"m-ov"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.bridge"},
		{name: "relative socket", stdin: `{"ipam":{"network":"ov","socket":"agent.sock"}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.socket"},
		{name: "network not a string", stdin: `{"ipam":{"network":7}}`, wantCode: types.ErrDecodingFailure, wantMsg: "network"},
		{name: "bad attachments", stdin: `{"ipam":{"network":"ov"},"cni.dev/valid-attachments":{"a":1}}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "valid-attachments"},
		{name: "attachment without container", stdin: `{"ipam":{"network":"ov"},"cni.dev/valid-attachments":[{"ifname":"eth0"}]}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "valid-attachments[0]: containerID"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tc.stdin))
			if tc.wantCode == 0 {
				if err != nil {
					t.Fatalf("ParseConfig: %v", err)
				}
				got.PrevResult = nil
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("ParseConfig =\n%+v\nwant\n%+v", got, tc.want)
				}
				return
			}
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != tc.wantCode || !strings.Contains(ce.Msg, tc.wantMsg) {
				t.Fatalf("ParseConfig error = %#v; want code %d with %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

// TestParseConfigReadsConflist: carve-ipam reads its own section back from
// the bridge plugin's configuration in the conflist the agent writes.
func TestParseConfigReadsConflist(t *testing.T) {
	tests := []struct {
		overlay, socket, wantSocket string
	}{
		{"carve", "/run/carve/other.sock", "/run/carve/other.sock"},
		{"abcdefghij-13", "", netconf.DefaultSocket},
	}
	for _, tc := range tests {
		t.Run(tc.overlay, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := netconf.WriteConflist(dir, netconf.Conflist{Overlay: tc.overlay, MTU: 1420, Socket: tc.socket}); err != nil {
				t.Fatal(err)
			}
			list, err := libcni.LoadNetworkConf(dir, tc.overlay)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := ParseConfig(list.Plugins[0].Bytes)
			if err != nil {
				t.Fatalf("ParseConfig(bridge plugin config): %v", err)
			}
			// The list's entry only: libcni adds cniVersion and name when it
			// runs the plugin.
			want := &Config{Network: tc.overlay, Bridge: api.BridgeMesos, Socket: tc.wantSocket}
			if cfg.PrevResult, cfg.ValidAttachments = nil, nil; !reflect.DeepEqual(cfg, want) {
				t.Errorf("ParseConfig =\n%+v\nwant\n%+v", cfg, want)
			}
		})
	}
}
