package labcluster

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/carve-net/carve/test/lab/proclab"
)

// RogueMeshPort is where a rogue gossip peer listens, in its host's
// namespace beside the agent's mesh port.
const RogueMeshPort = AgentMeshPort + 10

// StartRogue starts a rogue mesh peer in h's namespace: `carve-lab
// rogue-gossip`, which joins the agents' mesh at every running agent's
// mesh address, with the mesh password when withPassword, and broadcasts
// the membership message in messageFile on the agents' channel until it
// is stopped (Process.Stop; Close stops it too). Its log names what it
// sees of the mesh. name tells rogues apart in logs.
func (c *Cluster) StartRogue(h *Host, name string, withPassword bool, messageFile string) (*Process, error) {
	return c.startRogue(h, name, withPassword, "", messageFile)
}

// startRogue is StartRogue on a mesh channel ("": the agents' membership
// channel), with more rogue-gossip flags.
func (c *Cluster) startRogue(h *Host, name string, withPassword bool, channel, messageFile string, more ...string) (*Process, error) {
	if c.opts.LabBinary == "" {
		return nil, fmt.Errorf("labcluster: no carve-lab binary (Options.LabBinary, $%s) to run a rogue peer", LabBinaryEnv)
	}
	var peers []string
	for _, o := range c.Hosts() {
		if o.Agent.Running() {
			peers = append(peers, hostPort(o.IP().Addr(), AgentMeshPort))
		}
	}
	args := []string{"rogue-gossip", "--id", name, "--mesh-addr", hostPort(h.IP().Addr(), RogueMeshPort),
		"--peers", strings.Join(peers, ","), "--message", messageFile}
	if withPassword {
		args = append(args, "--mesh-password-file", c.sec.meshPassword)
	}
	if channel != "" {
		args = append(args, "--channel", channel)
	}
	args = append(args, more...)
	p := proclab.New(name, filepath.Join(c.Dir, "logs", name+".log"), h.NS.Namespace)
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.rogues = append(c.rogues, p)
	}
	c.mu.Unlock()
	if closed {
		return nil, errors.New("labcluster: the cluster is closed")
	}
	if err := p.Start(c.opts.LabBinary, args); err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	c.log.Info("rogue mesh peer started", "name", name, "host", h.Name, "password", withPassword, "pid", p.PID())
	return p, nil
}
