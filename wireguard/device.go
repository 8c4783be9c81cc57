// Package wireguard is the agent's encrypted path between hosts: its
// WireGuard device (the kernel's when the module exists, else userspace
// wireguard-go inside the agent), the device's peers as the agents' signed
// records give them, and the routes that send those peers' overlay subnets
// through the device. Both implementations are configured the same way,
// with wgctrl (genetlink for the kernel's, the UAPI socket for the
// userspace one).
//
// It works in the process's own network namespace: the userspace device's
// goroutines open their sockets wherever they run.
package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Implementation says which WireGuard carries the traffic.
type Implementation string

// The implementations Open may choose.
const (
	// Kernel is the kernel module's device: it outlives the agent, so
	// traffic flows while the agent restarts.
	Kernel Implementation = "kernel"
	// Userspace is wireguard-go in the agent's process, on a TUN device:
	// it goes away with the agent (see docs/security.md for its costs).
	Userspace Implementation = "userspace"
)

// Protocol is the rtm_protocol of the routes this package creates. It is
// not vxlan.Protocol: the VXLAN dataplane removes every route marked with
// its own that it does not want, and these are not its.
const Protocol = 203

// RouteMetric is the metric of the routes through the device: below the
// VXLAN routes' (1024 and up), so that a peer that just got a key is
// reached through WireGuard at once, before its VXLAN route is gone, and
// one that lost its key falls back to VXLAN as soon as this route goes.
const RouteMetric = 1000

// Options configures Open.
type Options struct {
	// Name of the interface (at most 15 bytes).
	Name string
	// MTU of the interface when it is created (Apply keeps it current).
	MTU int
	// Userspace skips the kernel's WireGuard even when the module exists.
	Userspace bool
	// Logger receives what the device does; nil discards.
	Logger *slog.Logger
}

// Device is an open WireGuard interface and the means to configure it.
type Device struct {
	name   string
	impl   Implementation
	log    *slog.Logger
	client configurator
	nl     *netlink.Handle
	// userspace and uapi are wireguard-go's device and its UAPI socket
	// (nil for the kernel's device).
	userspace *device.Device
	uapi      net.Listener

	// mu serializes the device's configuration (Apply, the handshake
	// check, Close).
	mu     sync.Mutex
	closed bool
	// putIn are the peers put in and waiting for their first handshake,
	// with when (rehandshake.go); rehandshake checks them.
	putIn       map[wgtypes.Key]putInPeer
	rehandshake *time.Timer
	// own is the device's public key as last configured or read: which
	// side of a peer pair yields (yieldTo).
	own wgtypes.Key
}

// configurator is what the device needs of wgctrl's client (a fake in
// tests).
type configurator interface {
	Device(name string) (*wgtypes.Device, error)
	ConfigureDevice(name string, cfg wgtypes.Config) error
	Close() error
}

// ErrDeviceBusy is returned by Open when an interface of that name exists
// and is not a WireGuard device carve can take over.
var ErrDeviceBusy = errors.New("wireguard: the interface name is taken")

// Open creates the interface (or takes over the kernel device of that
// name that a previous run left) and brings it up with no key and no peers.
func Open(ctx context.Context, opts Options) (*Device, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("wireguard: netlink: %w", err)
	}
	d := &Device{name: opts.Name, log: opts.Logger.With("device", opts.Name), nl: nl, putIn: map[wgtypes.Key]putInPeer{}}
	ok := false
	defer func() {
		if !ok {
			d.Close()
		}
	}()
	if err := d.create(opts); err != nil {
		return nil, err
	}
	client, err := wgctrl.New()
	if err != nil {
		return nil, fmt.Errorf("wireguard: wgctrl: %w", err)
	}
	d.client = client
	link, err := nl.LinkByName(opts.Name)
	if err != nil {
		return nil, fmt.Errorf("wireguard: %s: %w", opts.Name, err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("wireguard: set %s up: %w", opts.Name, err)
	}
	d.log.Info("wireguard device open", "implementation", d.impl)
	ok = true
	return d, nil
}

// create makes the interface: the kernel's device when the module exists,
// else wireguard-go on a TUN device with its UAPI socket.
func (d *Device) create(opts Options) error {
	if link, err := d.nl.LinkByName(opts.Name); err == nil {
		if link.Type() != "wireguard" {
			return fmt.Errorf("%w: %s is a %s device (another process's?); give the agent another --wireguard-device", ErrDeviceBusy, opts.Name, link.Type())
		}
		d.impl = Kernel
		return nil
	}
	if !opts.Userspace {
		err := d.nl.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: opts.Name, MTU: opts.MTU}})
		if err == nil {
			d.impl = Kernel
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("wireguard: create %s: %w", opts.Name, err)
		}
		d.log.Info("no WireGuard in the kernel: running wireguard-go in the agent", "err", err)
	}
	d.impl = Userspace
	mtu := opts.MTU
	if mtu <= 0 {
		mtu = device.DefaultMTU
	}
	t, err := tun.CreateTUN(opts.Name, mtu)
	if err != nil {
		return fmt.Errorf("wireguard: create TUN device %s: %w", opts.Name, err)
	}
	log := d.log.With("implementation", Userspace)
	d.userspace = device.NewDevice(t, conn.NewDefaultBind(), &device.Logger{
		Verbosef: func(format string, args ...any) { log.Debug(fmt.Sprintf(format, args...)) },
		Errorf:   func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...)) },
	})
	f, err := ipc.UAPIOpen(opts.Name)
	if err != nil {
		return fmt.Errorf("wireguard: UAPI socket of %s (/var/run/wireguard is shared by every network namespace of a file system: give each host its own --wireguard-device there): %w", opts.Name, err)
	}
	if d.uapi, err = ipc.UAPIListen(opts.Name, f); err != nil {
		f.Close()
		return fmt.Errorf("wireguard: UAPI socket of %s: %w", opts.Name, err)
	}
	go d.serveUAPI(d.uapi, d.userspace)
	return nil
}

// serveUAPI answers wgctrl (the agent's and `wg`'s) on the UAPI socket
// until it is closed.
func (d *Device) serveUAPI(l net.Listener, dev *device.Device) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go dev.IpcHandle(c)
	}
}

// Name is the interface's name.
func (d *Device) Name() string { return d.name }

// Implementation tells which WireGuard the device is.
func (d *Device) Implementation() Implementation { return d.impl }

// Close releases the device. The kernel's interface stays, with its peers
// and routes, so that traffic flows while the agent restarts; the
// userspace one goes with its process (its routes with it).
func (d *Device) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.rehandshake != nil {
		d.rehandshake.Stop()
	}
	if d.uapi != nil {
		d.uapi.Close()
	}
	if d.userspace != nil {
		d.userspace.Close()
	}
	if d.client != nil {
		d.client.Close()
	}
	if d.nl != nil {
		d.nl.Close()
	}
}

// Remove takes encryption down: it deletes the interface named name, when
// it is a kernel WireGuard device (a userspace one goes with its agent),
// and every route this package made (the
// unreachable ones of strict mode too). Nothing else is touched.
func Remove(ctx context.Context, name string) error {
	nl, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("wireguard: netlink: %w", err)
	}
	defer nl.Close()
	var errs []error
	if link, err := nl.LinkByName(name); err == nil && link.Type() == "wireguard" {
		if err := nl.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("wireguard: delete %s: %w", name, err))
		}
	}
	routes, err := ownRoutes(nl)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, r := range routes {
		if err := nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("wireguard: delete route %s: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}
