//go:build !race

// Real mesh routers over TCP on 127.0.0.1 (see mesh_tcp_test.go for why
// not under -race), changing their password.

package gossip_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

// passwordRound is a peer's passwords in a round of a change from old to
// next: 0 before, 1 accepting next, 2 sending next and accepting old, 3
// after.
func passwordRound(round int) ([]byte, [][]byte) {
	old, next := []byte("old secret"), []byte("next secret")
	switch round {
	case 0:
		return old, nil
	case 1:
		return old, [][]byte{next}
	case 2:
		return next, [][]byte{old}
	}
	return next, nil
}

// TestMeshPasswordChange: three peers change their password round by
// round, peer by peer, with no restart. Gossip among them flows
// throughout, and after each round a newcomer a round behind and one of
// the round connect and converge; after the change a peer with the old
// password alone is refused.
func TestMeshPasswordChange(t *testing.T) {
	pw, _ := passwordRound(0)
	peers := []meshPeer{startPeer(t, "p0", pw, nil), startPeer(t, "p1", pw, nil), startPeer(t, "p2", pw, nil)}
	for _, p := range peers[1:] {
		if err := p.r.Connect(peers[0].addr); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	item := 0
	// flows broadcasts a new item from each peer and waits until all hold them.
	flows := func(what string) {
		t.Helper()
		for _, p := range peers {
			item++
			name := fmt.Sprintf("item-%d", item)
			want = append(want, name)
			p.ch.Broadcast(p.h.Add(name))
		}
		slices.Sort(want)
		for _, p := range peers {
			testutil.Eventually(t, 0, what+": "+p.r.Self()+" has every item", testutil.True(func() bool {
				got := p.h.Set()
				for _, w := range want {
					if !slices.Contains(got, w) {
						return false
					}
				}
				return true
			}))
		}
	}
	flows("before the change")
	for round := 1; round <= 3; round++ {
		for _, p := range peers {
			pw, acc := passwordRound(round)
			if err := p.r.SetPasswords(pw, acc); err != nil {
				t.Fatal(err)
			}
			flows(fmt.Sprintf("round %d, %s changed", round, p.r.Self()))
		}
		for _, behind := range []int{round - 1, round} {
			pw, acc := passwordRound(behind)
			n := startPeer(t, fmt.Sprintf("new-%d-%d", round, behind), pw, nil)
			if err := n.r.SetPasswords(pw, acc); err != nil {
				t.Fatal(err)
			}
			if err := n.r.Connect(peers[round%len(peers)].addr); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 0, fmt.Sprintf("after round %d a newcomer of round %d converges", round, behind), testutil.True(func() bool {
				return slices.Contains(n.h.Set(), want[0])
			}))
			n.r.Stop()
		}
	}
	// Two rounds behind: the old password alone is refused now.
	pw, _ = passwordRound(0)
	stale := startPeer(t, "stale", pw, nil)
	before := peers[0].refused.Load()
	if err := stale.r.Connect(peers[0].addr); err != nil {
		t.Fatal(err)
	}
	// Either side may see the mismatch first and close: the other then
	// sees a closed connection, not a refusal.
	testutil.Eventually(t, 0, "the old password is refused", testutil.True(func() bool {
		return stale.refused.Load() > 0 || peers[0].refused.Load() > before
	}))
	if got := stale.h.Set(); len(got) != 0 {
		t.Errorf("a peer with the old password got %v", got)
	}
	flows("after the change")
}
