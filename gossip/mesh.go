package gossip

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/weaveworks/mesh"
)

// MeshConfig configures a MeshRouter.
type MeshConfig struct {
	// ID is this peer's agent id. It is the mesh nickname, and the mesh
	// peer name is derived from a hash of it (see PeerName).
	ID string
	// Host and Port are where the router listens for other peers.
	Host string
	Port int
	// Password turns on mesh's authenticated encryption when non-nil: a
	// peer without the same password never completes a handshake, so never
	// exchanges gossip. Careful: an empty non-nil slice turns it on with an
	// empty secret; nil means none. See ReadPasswordFile.
	Password []byte
	// GossipInterval is how often every channel's complete state is
	// gossiped; 0 means mesh's default (30 s).
	GossipInterval time.Duration
	// ConnLimit bounds the connections; 0 means 64.
	ConnLimit int
	// NoDiscovery stops mesh from connecting to every peer it learns of
	// through the topology: the router connects only to the addresses
	// given to Connect (and accepts connections), and reaches the others
	// through its neighbours. Callers that keep a bounded set of
	// connections need it; without it the peers end up fully meshed.
	NoDiscovery bool
	// Logger receives the router's and mesh's messages; nil discards them.
	Logger *slog.Logger
	// AcceptedPasswords are accepted from peers besides Password during a
	// change of the mesh password; Password is what this peer sends with
	// (see third_party/mesh/passwords.go and SetPasswords).
	AcceptedPasswords [][]byte
	// OnPasswordRefused, when set, is called for every handshake refused
	// because the peer's password differs (or one side has none), so that
	// the caller can count them.
	OnPasswordRefused func()
}

// MeshRouter is a Router over one mesh.Router.
type MeshRouter struct {
	id     string
	router *mesh.Router
	log    *slog.Logger

	mu       sync.Mutex
	started  bool
	stopped  bool
	names    map[mesh.PeerName]string // learnt from nicknames
	channels map[string]bool
}

// PeerName derives the mesh peer name of an agent id: the first bytes of its
// SHA-256, as many as the mesh build's name flavour takes (6 by default).
// Two ids sharing a name would be one peer to mesh; with 48 bits that needs
// millions of agents to become likely.
func PeerName(id string) mesh.PeerName {
	sum := sha256.Sum256([]byte(id))
	return mesh.PeerNameFromBin(sum[:mesh.NameSize])
}

// NewMeshRouter creates a router. Register channels, then Start it.
func NewMeshRouter(cfg MeshConfig) (*MeshRouter, error) {
	if cfg.ID == "" {
		return nil, errors.New("gossip: empty peer id")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("peer", cfg.ID)
	connLimit := cfg.ConnLimit
	if connLimit == 0 {
		connLimit = 64
	}
	mc := mesh.Config{
		Host:              cfg.Host,
		Port:              cfg.Port,
		Password:          cfg.Password,
		AcceptedPasswords: cfg.AcceptedPasswords,
		ConnLimit:         connLimit,
		// Version 2 only: version 1 sends the handshake's features (peer
		// name, nickname, uid) in clear even with a password.
		ProtocolMinVersion: mesh.ProtocolMaxVersion,
		PeerDiscovery:      !cfg.NoDiscovery,
		TrustedSubnets:     []*net.IPNet{},
	}
	if cfg.GossipInterval > 0 {
		iv := cfg.GossipInterval
		mc.GossipInterval = &iv
	}
	mr, err := mesh.NewRouter(mc, PeerName(cfg.ID), cfg.ID, mesh.NullOverlay{}, meshLogger{log: log, refused: cfg.OnPasswordRefused})
	if err != nil {
		return nil, fmt.Errorf("gossip: mesh router: %w", err)
	}
	r := &MeshRouter{
		id:       cfg.ID,
		router:   mr,
		log:      log,
		names:    map[mesh.PeerName]string{PeerName(cfg.ID): cfg.ID},
		channels: map[string]bool{},
	}
	return r, nil
}

// meshLogger sends mesh's chatter (connections coming and going) to slog at
// debug level, except handshakes that failed on the password: a peer with
// another password (or none) is a misconfiguration or an intruder, and the
// operator should see it. mesh retries with a growing backoff, so these stay
// few.
type meshLogger struct {
	log     *slog.Logger
	refused func() // nil: not counted
}

func (l meshLogger) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if passwordMismatch(msg) {
		if l.refused != nil {
			l.refused()
		}
		l.log.Warn("mesh peer refused: its password differs (or one side has none): "+msg, "from", "mesh")
		return
	}
	l.log.Debug(msg, "from", "mesh")
}

// passwordMismatch recognises mesh's handshake errors that come from
// different passwords: the peer's messages do not decrypt, or one side asks
// for encryption and the other does not.
func passwordMismatch(msg string) bool {
	return strings.Contains(msg, "error during handshake") &&
		(strings.Contains(msg, "Unable to decrypt") || strings.Contains(msg, "password specified") ||
			strings.Contains(msg, "no password specificed")) // sic, mesh's spelling
}

// ReadPasswordFile reads a mesh password: the file's content without its
// trailing newline. An empty password is refused: mesh would encrypt with an
// empty secret, which anyone knows.
func ReadPasswordFile(path string) ([]byte, error) {
	b, err := readPassword(path)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("mesh password file %s is empty: write a secret into it (the same on every agent)", path)
	}
	return b, nil
}

// ReadAcceptedPasswordFile reads a password accepted besides the mesh
// password during a change of it, as ReadPasswordFile; an empty or absent
// file means none (nil): the flag stays set, the file holds a password
// during a change only.
func ReadAcceptedPasswordFile(path string) ([]byte, error) {
	b, err := readPassword(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil || len(b) == 0 {
		return nil, err
	}
	return b, nil
}

// readPassword is a password file's content without its trailing newline.
func readPassword(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mesh password: %w", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r")), nil
}

// SetPasswords replaces the mesh password this peer sends with, and those
// it accepts besides, for the connections made from now on: those up stay
// up, so a change made peer by peer never splits gossip. Encryption cannot
// be turned on or off this way.
func (r *MeshRouter) SetPasswords(password []byte, accepted [][]byte) error {
	if err := r.router.SetPasswords(password, accepted); err != nil {
		return fmt.Errorf("gossip: %w", err)
	}
	return nil
}

// Self is this peer's id.
func (r *MeshRouter) Self() string { return r.id }

// Channel registers a channel; it must come before Start.
func (r *MeshRouter) Channel(name string, h Handler) (Channel, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return nil, fmt.Errorf("%w: channel %q", ErrStarted, name)
	}
	if r.channels[name] {
		return nil, fmt.Errorf("%w: %q", ErrDuplicateChannel, name)
	}
	c := &meshChannel{router: r, name: name, h: h, log: r.log.With("channel", name)}
	g, err := r.router.NewGossip(name, (*meshReceiver)(c))
	if err != nil {
		return nil, fmt.Errorf("gossip: channel %q: %w", name, err)
	}
	c.g = g
	r.channels[name] = true
	return c, nil
}

// Start listens for peers. mesh panics when it cannot listen; that comes
// back as an error here.
func (r *MeshRouter) Start() (err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return ErrStopped
	}
	if r.started {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("gossip: mesh listen: %v", p)
		}
	}()
	r.router.Start()
	r.started = true
	return nil
}

// Connect asks the router to connect to peers at the given host:port
// addresses (and to keep trying); further peers are discovered through them.
func (r *MeshRouter) Connect(addrs ...string) error {
	if r.isStopped() {
		return ErrStopped
	}
	return errors.Join(r.router.ConnectionMaker.InitiateConnections(addrs, false)...)
}

// Forget has the router stop trying the addresses given to Connect (those
// of peers that were deleted or moved): mesh retries every address it was
// given for ever. A connection that is up stays up until it breaks.
func (r *MeshRouter) Forget(addrs ...string) error {
	if r.isStopped() {
		return ErrStopped
	}
	r.router.ConnectionMaker.ForgetConnections(addrs)
	return nil
}

// Stop stops the router: it forgets its peers, stops listening and closes
// its connections (carve's mesh fork, third_party/mesh, closes them; see its
// PATCHED.md), so that its peers see it leave and a new router may take its
// address. The channels drop whatever still arrives.
func (r *MeshRouter) Stop() error {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return nil
	}
	r.stopped = true
	r.mu.Unlock()
	r.router.ConnectionMaker.ForgetConnections(r.router.ConnectionMaker.Targets(false))
	return r.router.Stop()
}

func (r *MeshRouter) isStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

// Peers returns the ids of the other peers mesh knows, sorted.
func (r *MeshRouter) Peers() []string {
	var out []string
	for _, d := range r.router.Peers.Descriptions() {
		if d.Self || d.NickName == "" {
			continue
		}
		r.learn(d.Name, d.NickName)
		out = append(out, d.NickName)
	}
	sort.Strings(out)
	return out
}

// Neighbours returns the ids of the peers this router is connected to
// directly, sorted.
func (r *MeshRouter) Neighbours() []string {
	var out []string
	var names []mesh.PeerName
	for _, d := range r.router.Peers.Descriptions() {
		if !d.Self {
			names = append(names, d.Name)
		}
	}
	// A connection is there once its handshake is done (mesh does not say
	// whether it was confirmed since).
	for _, c := range r.router.Ourself.ConnectionsTo(names) {
		if p := c.Remote(); p != nil && r.learn(p.Name, p.NickName) {
			out = append(out, p.NickName)
		}
	}
	sort.Strings(out)
	return out
}

// learn records the id of a peer name, unless the nickname does not hash to
// the name (another naming scheme, or a collision).
func (r *MeshRouter) learn(name mesh.PeerName, id string) bool {
	if PeerName(id) != name {
		r.log.Warn("mesh peer nickname does not match its name", "name", name.String(), "nickname", id)
		return false
	}
	r.mu.Lock()
	r.names[name] = id
	r.mu.Unlock()
	return true
}

// idOf maps a mesh peer name back to its agent id ("" when unknown).
func (r *MeshRouter) idOf(name mesh.PeerName) string {
	r.mu.Lock()
	id, ok := r.names[name]
	r.mu.Unlock()
	if ok {
		return id
	}
	if p := r.router.Peers.Fetch(name); p != nil && r.learn(name, p.NickName) {
		return p.NickName
	}
	return ""
}

type meshChannel struct {
	router *MeshRouter
	name   string
	h      Handler
	g      mesh.Gossip
	log    *slog.Logger
}

// meshData carries our Data through mesh.
type meshData struct{ d Data }

func (m meshData) Encode() [][]byte { return m.d.Encode() }

func (m meshData) Merge(o mesh.GossipData) mesh.GossipData {
	other, ok := o.(meshData)
	if !ok {
		return o
	}
	return meshData{m.d.Merge(other.d)}
}

func wrap(d Data) mesh.GossipData {
	if d == nil {
		return nil // a typed nil would reach mesh as non-nil
	}
	return meshData{d}
}

func (c *meshChannel) Broadcast(d Data) {
	if d != nil && !c.router.isStopped() {
		c.g.GossipBroadcast(meshData{d})
	}
}

func (c *meshChannel) Gossip(d Data) {
	if d != nil && !c.router.isStopped() {
		c.g.GossipNeighbourSubset(meshData{d})
	}
}

// Unicast prefixes msg with the sender's id, so that the receiver learns it
// without waiting for mesh's topology gossip.
func (c *meshChannel) Unicast(dst string, msg []byte) error {
	if c.router.isStopped() {
		return ErrStopped
	}
	if dst == c.router.id {
		return fmt.Errorf("%w: unicast to self", ErrUnknownPeer)
	}
	env := binary.AppendUvarint(nil, uint64(len(c.router.id)))
	env = append(env, c.router.id...)
	env = append(env, msg...)
	if err := c.g.GossipUnicast(PeerName(dst), env); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnknownPeer, dst, err)
	}
	return nil
}

// meshReceiver is the mesh.Gossiper side of a channel. Errors are logged and
// never returned to mesh, which would close the connection to the sender.
type meshReceiver meshChannel

func (c *meshReceiver) OnGossipUnicast(src mesh.PeerName, env []byte) error {
	if c.router.isStopped() {
		return nil
	}
	n, k := binary.Uvarint(env)
	if k <= 0 || n > uint64(len(env)-k) {
		c.log.Warn("dropping malformed unicast", "from", src.String())
		return nil
	}
	id := string(env[k : k+int(n)])
	if PeerName(id) != src {
		c.log.Warn("dropping unicast whose sender id does not match its peer name", "from", src.String(), "id", id)
		return nil
	}
	if err := c.h.OnUnicast(id, env[k+int(n):]); err != nil {
		c.log.Warn("unicast handler", "from", id, "err", err)
	}
	return nil
}

func (c *meshReceiver) OnGossipBroadcast(src mesh.PeerName, update []byte) (mesh.GossipData, error) {
	if c.router.isStopped() {
		return nil, nil
	}
	d, err := c.h.OnBroadcast(c.router.idOf(src), update)
	if err != nil {
		c.log.Warn("broadcast handler", "from", c.router.idOf(src), "err", err)
		return nil, nil
	}
	return wrap(d), nil
}

func (c *meshReceiver) Gossip() mesh.GossipData {
	if c.router.isStopped() {
		return nil
	}
	return wrap(c.h.Gossip())
}

func (c *meshReceiver) OnGossip(msg []byte) (mesh.GossipData, error) {
	if c.router.isStopped() {
		return nil, nil
	}
	d, err := c.h.OnGossip(msg)
	if err != nil {
		c.log.Warn("gossip handler", "err", err)
		return nil, nil
	}
	return wrap(d), nil
}
