package labcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
)

// Master is one master process and its addresses.
type Master struct {
	*Process
	// ID is its Raft server id ("m1").
	ID string
	// Host is the host namespace it runs in.
	Host *Host
	// HTTPAddr and RaftAddr are its listeners, on its host's underlay IP.
	HTTPAddr, RaftAddr string
	// DataDir is its --data-dir (Raft log and snapshots); it survives
	// restarts.
	DataDir string

	scheme string // http, or https when the masters serve TLS
}

// URL is the master's HTTP base URL.
func (m *Master) URL() string { return m.scheme + "://" + m.HTTPAddr }

// MasterURLs are the masters' HTTP base URLs.
func (c *Cluster) MasterURLs() []string {
	var out []string
	for _, m := range c.Masters() {
		out = append(out, m.URL())
	}
	return out
}

// Client returns a master client (failover across all masters) whose
// connections start in the lab.
func (c *Cluster) Client() *apiclient.Client {
	cl, err := apiclient.NewClient(c.MasterURLs(), c.http)
	if err != nil {
		panic(fmt.Sprintf("labcluster: master URLs: %v", err)) // the cluster always has masters
	}
	return cl
}

// peersFlag is the --peers value shared by every master.
func (c *Cluster) peersFlag() string {
	var parts []string
	for _, m := range c.Masters() {
		parts = append(parts, m.ID+"="+m.RaftAddr)
	}
	return strings.Join(parts, ",")
}

// StartMasters starts every master and waits for a leader.
func (c *Cluster) StartMasters(ctx context.Context) error {
	for _, m := range c.Masters() {
		if err := c.StartMaster(m); err != nil {
			return err
		}
	}
	m, err := c.WaitLeader(ctx)
	if err != nil {
		return err
	}
	c.log.Info("masters up", "leader", m.ID)
	return nil
}

// StartMaster starts (or restarts, from its data dir) one master.
func (c *Cluster) StartMaster(m *Master) error { return c.StartMasterWith(m) }

// StartMasterWith starts one master like StartMaster, with extra flags
// (--restore-from FILE, say).
func (c *Cluster) StartMasterWith(m *Master, extra ...string) error {
	args := []string{"master", "--id", m.ID, "--data-dir", m.DataDir,
		"--http-addr", m.HTTPAddr, "--raft-addr", m.RaftAddr, "--peers", c.peersFlag(),
		"--config", c.configPath, "--log-level", c.opts.LogLevel}
	args = append(args, c.sec.masterArgs(m.ID)...)
	args = append(args, c.opts.MasterArgs...)
	args = append(args, extra...)
	if err := m.Start(c.opts.Binary, args); err != nil {
		return fmt.Errorf("labcluster: %w", err)
	}
	c.log.Info("master started", "id", m.ID, "host", m.Host.Name, "http", m.HTTPAddr, "pid", m.PID())
	return nil
}

// WaitLeader waits until a running master is leader and the network
// configuration is committed, and returns it.
func (c *Cluster) WaitLeader(ctx context.Context) (*Master, error) {
	var leader *Master
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		running := 0
		var errs []error
		for _, m := range c.Masters() {
			if !m.Running() {
				continue
			}
			running++
			cl, err := apiclient.NewClient([]string{m.URL()}, c.http)
			if err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			cs, err := cl.ClusterStatus(cctx)
			if err == nil && cs.Role == "leader" && cs.Leader != nil && cs.Leader.HTTPAddr != "" {
				var st *api.State
				st, err = cl.State(cctx, apiclient.StateOptions{})
				if err == nil && st.Index > 0 {
					cancel()
					leader = m
					return nil
				}
			}
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m.ID, err))
			}
		}
		if running == 0 {
			return retry.Permanent(errors.New("no master is running"))
		}
		return errors.Join(append([]error{errors.New("no leader yet")}, errs...)...)
	})
	if err != nil {
		return nil, fmt.Errorf("labcluster: wait for a leader: %w", err)
	}
	return leader, nil
}

// StopMaster stops a master with SIGTERM (SIGKILL after StopTimeout).
func (c *Cluster) StopMaster(ctx context.Context, m *Master) error {
	c.log.Info("stopping master", "id", m.ID, "pid", m.PID())
	return m.Stop(ctx, 0)
}

// KillMaster kills a master with SIGKILL.
func (c *Cluster) KillMaster(m *Master) error {
	c.log.Info("killing master", "id", m.ID, "pid", m.PID())
	return m.Kill()
}

// State is the masters' state (a consistent read).
func (c *Cluster) State(ctx context.Context) (*api.State, error) {
	return c.Client().State(ctx, apiclient.StateOptions{Consistent: true})
}
