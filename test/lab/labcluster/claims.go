package labcluster

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/pki"
)

// What a compromised host holds, for the end-to-end tests of the trust
// model: its agent certificate, its claim key, and the mesh password.

// StartRingRogue is StartRogue broadcasting a ring message (messageFile)
// on the agents' ring channel instead of a membership message.
func (c *Cluster) StartRingRogue(h *Host, name string, withPassword bool, messageFile string) (*Process, error) {
	return c.startRogue(h, name, withPassword, ipam.RingChannel, messageFile)
}

// RingMessage is a ring message holding one overlay family's ring
// (ring.Ring.Encode) as agents send it on the ring channel, to hand to
// StartRingRogue or StartRingFeeder (the agent's own type is internal to
// its IPAM).
func RingMessage(clusterID, overlay, family string, ring []byte) ([]byte, error) {
	type entry struct {
		Overlay string `json:"overlay"`
		Family  string `json:"family"`
		Ring    []byte `json:"ring"`
	}
	return json.Marshal(struct {
		ClusterID string  `json:"cluster_id,omitempty"`
		Rings     []entry `json:"rings"`
	}{clusterID, []entry{{overlay, family, ring}}})
}

// StartRingFeeder starts a peer in h's namespace that joins the agents'
// mesh with its password and broadcasts the ring message in messageFile
// times times, then stays in the mesh silent on the ring channel (`carve-lab
// rogue-gossip --count`): test/bench/scale hands the real agent, once, the
// signed claims its synthetic peers' gossip would have brought.
func (c *Cluster) StartRingFeeder(h *Host, name, messageFile string, times int) (*Process, error) {
	return c.startRogue(h, name, true, ipam.RingChannel, messageFile, "--count", strconv.Itoa(times))
}

// MasterClientAs is a master client presenting h's agent certificate, as
// the compromised host h would.
func (c *Cluster) MasterClientAs(h *Host) (*apiclient.Client, error) {
	cfg, err := c.sec.files(h.CertName()).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	return apiclient.NewClient(c.MasterURLs(), newHTTPClient(c.Lab.Underlay, cfg))
}

// ClaimKey is h's agent's claim key, read from its data dir (the agent
// makes it on its first start).
func (c *Cluster) ClaimKey(h *Host) (ed25519.PrivateKey, error) {
	path := filepath.Join(h.AgentDataDir, pki.ClaimKeyFile)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("labcluster: %s has no claim key (start its agent first): %w", h.Name, err)
	}
	return pki.LoadOrCreateClaimKey(path)
}

// StartRingRogueReloading is StartRingRogue for a rogue that changes what
// it says while it runs: the peer reads messageFile again before every
// broadcast, one every interval (`carve-lab rogue-gossip --reload`), so
// that a test replaces the file (by rename) for each of its messages.
func (c *Cluster) StartRingRogueReloading(h *Host, name, messageFile string, interval time.Duration) (*Process, error) {
	return c.startRogue(h, name, true, ipam.RingChannel, messageFile, "--reload", "--interval", interval.String())
}
