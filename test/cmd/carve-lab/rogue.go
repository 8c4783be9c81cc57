package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/carve-net/carve/agent"
	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/cli"
)

// rogueCommand is the hidden subcommand that runs a rogue mesh peer.
const rogueCommand = "rogue-gossip"

// runRogue is `carve-lab rogue-gossip`: a mesh peer that joins the agents'
// mesh (with their password or without) and broadcasts one message, read
// from a file, on one of the agents' channels (membership, or the rings
// with --channel), again and again until it is stopped, or --count times
// (then it stays in the mesh, silent on the channel). It merges nothing it
// hears. The end-to-end tests run it in a lab host's namespace
// (labcluster.StartRogue) to show that agents refuse what it says;
// test/bench/scale runs it with --count to hand the real agent the signed
// claims of thousands of synthetic agents once, as their gossip would
// have. With --reload it reads the file again before every broadcast, so
// that a test may change what it says while it runs (TestRogueAgent swaps
// the file, by rename, for each of its rogue's ring messages). It logs the
// mesh peers it sees, and mesh's handshake errors, to stderr.
func runRogue(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("carve-lab " + rogueCommand)
	id := fs.String("id", "rogue", "mesh peer id")
	meshAddr := fs.String("mesh-addr", "", "IP:PORT to listen on")
	peers := fs.String("peers", "", "mesh addresses (IP:PORT) of the agents to join, comma separated")
	passwordFile := fs.String("mesh-password-file", "", "the agents' mesh password (default: none, an unencrypted peer)")
	messageFile := fs.String("message", "", "file holding the membership message (JSON) to broadcast on the agents' channel")
	interval := fs.Duration("interval", time.Second, "how often the message is broadcast, and mesh gossips")
	channel := fs.String("channel", agent.GossipChannel, "mesh channel to broadcast on (the agents' membership channel, or "+ipam.RingChannel+" for ring claims)")
	count := fs.Int("count", 0, "broadcast the message this many times, then stay silent on the channel (0: until stopped)")
	reload := fs.Bool("reload", false, "read --message again before every broadcast (replace it by rename to change what is said)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	listen, err := netip.ParseAddrPort(*meshAddr)
	if err != nil {
		return fmt.Errorf("%w: --mesh-addr %q: want IP:PORT", cli.ErrUsage, *meshAddr)
	}
	targets := strings.Split(*peers, ",")
	for _, p := range targets {
		if _, err := netip.ParseAddrPort(p); err != nil {
			return fmt.Errorf("%w: --peers: %q is not IP:PORT", cli.ErrUsage, p)
		}
	}
	if *interval <= 0 {
		return fmt.Errorf("%w: --interval %s: want a positive duration", cli.ErrUsage, *interval)
	}
	if *count < 0 {
		return fmt.Errorf("%w: --count %d: want 0 (until stopped) or more", cli.ErrUsage, *count)
	}
	msg, err := os.ReadFile(*messageFile)
	if err != nil {
		return fmt.Errorf("--message: %w", err)
	}
	var password []byte
	if *passwordFile != "" {
		if password, err = gossip.ReadPasswordFile(*passwordFile); err != nil {
			return fmt.Errorf("--mesh-password-file: %w", err)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	router, err := gossip.NewMeshRouter(gossip.MeshConfig{ID: *id, Host: listen.Addr().String(), Port: int(listen.Port()),
		Password: password, GossipInterval: *interval, Logger: log})
	if err != nil {
		return err
	}
	h := &rogueHandler{}
	h.set(msg)
	ch, err := router.Channel(*channel, h)
	if err != nil {
		return err
	}
	if err := router.Start(); err != nil {
		return err
	}
	defer router.Stop()
	if err := router.Connect(targets...); err != nil {
		return fmt.Errorf("connect to %s: %w", *peers, err)
	}
	log.Info("rogue peer started", "id", *id, "mesh_addr", *meshAddr, "peers", targets, "password", password != nil, "message_bytes", len(msg))
	t := time.NewTicker(*interval)
	defer t.Stop()
	var seen []string
	sent := 0
	for {
		select {
		case <-ctx.Done():
			log.Info("rogue peer stopped")
			return nil
		case <-t.C:
			if now := router.Peers(); !slices.Equal(now, seen) {
				seen = now
				log.Info("mesh peers", "peers", now)
			}
			if *count > 0 && sent >= *count {
				continue
			}
			if *reload {
				next, err := os.ReadFile(*messageFile)
				if err != nil {
					log.Warn("--message unreadable: the last one is broadcast again", "err", err)
				} else if !slices.Equal(next, msg) {
					msg = next
					h.set(msg)
					log.Info("message changed", "message_bytes", len(msg))
				}
			}
			ch.Broadcast(rawMessage(msg))
			if sent++; *count > 0 && sent >= *count {
				h.silent.Store(true) // nor in mesh's periodic gossip
				log.Info("message broadcast: silent from now on", "times", sent)
			}
		}
	}
}

// rogueHandler gossips its message, until silent, and ignores everything
// it hears.
type rogueHandler struct {
	msg    atomic.Pointer[[]byte] // what it says now (--reload changes it)
	silent atomic.Bool
}

// set makes msg what the handler gossips from now on.
func (h *rogueHandler) set(msg []byte) { h.msg.Store(&msg) }

func (h *rogueHandler) Gossip() gossip.Data {
	if h.silent.Load() {
		return nil
	}
	return rawMessage(*h.msg.Load())
}
func (*rogueHandler) OnGossip([]byte) (gossip.Data, error)            { return nil, nil }
func (*rogueHandler) OnBroadcast(string, []byte) (gossip.Data, error) { return nil, nil }
func (*rogueHandler) OnUnicast(string, []byte) error                  { return nil }

// rawMessage is a message as it goes on the wire.
type rawMessage []byte

func (m rawMessage) Encode() [][]byte              { return [][]byte{m} }
func (m rawMessage) Merge(gossip.Data) gossip.Data { return m }
