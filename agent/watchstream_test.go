package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestAgentWatchesChangesStream: an agent follows the masters' changes
// over one stream, falls back to the long poll where the stream is 404
// (a master of a release before it) or where no frame comes on it (a
// proxy that buffers answers), and opens the stream again from its index
// when the master drops it; every change registered meanwhile is
// programmed in its kernel.
func TestAgentWatchesChangesStream(t *testing.T) {
	t.Parallel() // its own namespaces, masters and data dirs
	tests := []struct {
		name    string
		streams bool // the proxy passes the stream on (else 404)
		stall   bool // the proxy answers the stream 200, then nothing
		drop    bool // the stream is dropped between the two registrations
		// check says what the watches counted (streams opened, streams
		// refused 404, long polls) must show.
		check func(opened, refused, longPolls int) error
	}{
		{"follows the stream", true, false, false, func(opened, refused, longPolls int) error {
			if opened < 1 || refused != 0 || longPolls != 0 {
				return fmt.Errorf("want the stream alone")
			}
			return nil
		}},
		{"long-polls an old master", false, false, false, func(opened, refused, longPolls int) error {
			if opened != 0 || refused != 1 || longPolls < 1 {
				return fmt.Errorf("want one refused stream, then long polls")
			}
			return nil
		}},
		{"long-polls behind a proxy that buffers", true, true, false, func(opened, refused, longPolls int) error {
			if opened != 1 || longPolls < 1 {
				return fmt.Errorf("want one stream, then long polls")
			}
			return nil
		}},
		{"resumes a dropped stream", true, false, true, func(opened, refused, longPolls int) error {
			if opened < 2 || refused != 0 || longPolls != 0 {
				return fmt.Errorf("want the stream opened again, no long poll")
			}
			return nil
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hosts, dir, m := hostsWithMaster(t, 1)
			gnet := fakegossip.New(fakegossip.Config{Seed: uint64(61 + i)})
			t.Cleanup(gnet.Close)
			t.Logf("fake gossip seed %d", gnet.Seed())
			proxy := newMasterProxy(t, m)
			proxy.setStreams(tt.streams, tt.stall)
			a := runAgent(t, newTestAgent(t, hosts[0], proxy.URL(), filepath.Join(dir, "a0"), gnet))
			op := masterClient(t, m)
			ctx := context.Background()
			for j, peer := range []string{"peer1", "peer2"} {
				if j == 1 && tt.drop {
					opened, _, _ := proxy.watches()
					proxy.dropStreams()
					testutil.Eventually(t, 0, "the agent opens the stream again", testutil.True(func() bool {
						now, _, _ := proxy.watches()
						return now > opened
					}))
				}
				if _, err := op.Register(ctx, api.RegisterRequest{AgentID: peer, IP: fmt.Sprintf("198.18.10.%d", j+1)}); err != nil {
					t.Fatal(err)
				}
				testutil.Eventually(t, 0, "the agent programs "+peer+" from the changes", testutil.True(func() bool {
					return programmedPeers(a.Agent)[peer] && masterReads(t, a.Agent, "changes") > float64(j)
				}))
			}
			opened, refused, longPolls := proxy.watches()
			if err := tt.check(opened, refused, longPolls); err != nil {
				t.Fatalf("streams opened %d, refused %d, long polls %d: %v", opened, refused, longPolls, err)
			}
		})
	}
}
