package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// iperfPort is the iperf3 server's port in the server's namespace.
const iperfPort = 5201

// udpPayload is the size of the small UDP datagrams.
const udpPayload = 64

// path is one way across the lab: a client namespace and a server namespace
// reached at addr.
type path struct {
	name     string
	from, to *netnslab.Namespace
	addr     netip.Addr
	server   *exec.Cmd
	done     chan struct{} // closed when the server exited
}

// meter runs the measurements.
type meter struct {
	iperf   string
	seconds int
	pings   int
}

// startServer starts an iperf3 server inside p.to (killed by stopServer,
// and by the lab's Close if the benchmark dies) and waits until it accepts
// a connection.
func (m *meter) startServer(ctx context.Context, p *path) error {
	cmd := exec.Command(m.iperf, "-s", "-p", strconv.Itoa(iperfPort))
	cmd.Stdout, cmd.Stderr = nil, os.Stderr
	if err := p.to.Start(cmd); err != nil {
		return fmt.Errorf("start iperf3 server in %s: %w", p.to.Name, err)
	}
	p.server, p.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The first round trips of a fresh path may be lost while neighbours
	// resolve; a server that is not listening yet refuses at once.
	return retry.Until(wctx, 200*time.Millisecond, func() error {
		_, err := m.iperfRun(wctx, p, "-n", "1K")
		return err
	})
}

// stopServer kills p's server by its PID.
func (p *path) stopServer() {
	if p.server == nil || p.server.Process == nil {
		return
	}
	_ = p.server.Process.Kill()
	<-p.done
}

// figure is one compared measurement: the overlay's median and the
// underlay's.
type figure struct {
	name           string
	unit           string
	value, base    float64
	higherIsBetter bool
}

// measurement is one kind of test run on a path, yielding one or more
// figures (in the order of figures).
type measurement struct {
	figures []figure // name, unit and direction; values filled by compare
	take    func(ctx context.Context, p *path) ([]float64, error)
}

func (m *meter) measurements() []measurement {
	tcp := func(streams int) measurement {
		name := fmt.Sprintf("TCP, %d stream", streams)
		if streams > 1 {
			name += "s"
		}
		return measurement{
			figures: []figure{
				{name: name, unit: "Gbit/s", higherIsBetter: true},
				// Throughput per CPU-second of the iperf3 client and
				// server (their processes' time, which includes the
				// softirq work the veths run in their context): the cost
				// of a byte, steadier than throughput on a shared machine.
				{name: name + ", per CPU-second of sender + receiver", unit: "Gbit/CPU-s", higherIsBetter: true},
			},
			take: func(ctx context.Context, p *path) ([]float64, error) { return m.tcp(ctx, p, streams) },
		}
	}
	return []measurement{
		tcp(1),
		tcp(4),
		{figures: []figure{{name: fmt.Sprintf("UDP, %d-byte datagrams", udpPayload), unit: "kpps", higherIsBetter: true}}, take: m.udp},
		{figures: []figure{{name: "round trip (ICMP echo)", unit: "ms"}}, take: m.rtt},
	}
}

// compare runs every measurement rounds times on each path, alternating
// the two, and returns the medians.
func (m *meter) compare(ctx context.Context, over, under *path, rounds int) ([]figure, error) {
	var out []figure
	for _, ms := range m.measurements() {
		vals := make([][]float64, len(ms.figures))
		bases := make([][]float64, len(ms.figures))
		for round := range rounds {
			for _, side := range []struct {
				p   *path
				acc [][]float64
			}{{under, bases}, {over, vals}} {
				fmt.Fprintf(os.Stderr, "== %s over the %s (round %d of %d)\n", ms.figures[0].name, side.p.name, round+1, rounds)
				v, err := ms.take(ctx, side.p)
				if err != nil {
					return nil, fmt.Errorf("%s over the %s: %w", ms.figures[0].name, side.p.name, err)
				}
				for i := range side.acc {
					side.acc[i] = append(side.acc[i], v[i])
				}
			}
		}
		for i, f := range ms.figures {
			f.value, f.base = median(vals[i]), median(bases[i])
			out = append(out, f)
		}
	}
	return out, nil
}

// iperfReport is the part of iperf3's JSON output the benchmark reads.
type iperfReport struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		// Sum is the UDP summary (the server's count of what arrived).
		Sum struct {
			Seconds     float64 `json:"seconds"`
			Packets     int64   `json:"packets"`
			LostPackets int64   `json:"lost_packets"`
		} `json:"sum"`
		// CPU is the share of one CPU the client (Host) and the server
		// (Remote) processes used over the test, in percent.
		CPU struct {
			Host   float64 `json:"host_total"`
			Remote float64 `json:"remote_total"`
		} `json:"cpu_utilization_percent"`
	} `json:"end"`
	Error string `json:"error"`
}

// iperfRun runs an iperf3 client from p.from to p's server.
func (m *meter) iperfRun(ctx context.Context, p *path, args ...string) (*iperfReport, error) {
	args = append([]string{"-c", p.addr.String(), "-p", strconv.Itoa(iperfPort), "-J"}, args...)
	cctx, cancel := context.WithTimeout(ctx, time.Duration(m.seconds+30)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, m.iperf, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := p.from.Run(cmd)
	var rep iperfReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return nil, fmt.Errorf("iperf3 %v from %s: %w (stderr: %s)", args, p.from.Name, errors.Join(runErr, err), bytes.TrimSpace(stderr.Bytes()))
	}
	if rep.Error != "" || runErr != nil {
		return nil, fmt.Errorf("iperf3 %v from %s: %s %w", args, p.from.Name, rep.Error, runErr)
	}
	return &rep, nil
}

// tcp is the TCP throughput of streams parallel streams in Gbit/s, as the
// receiver counted it, and that throughput per CPU-second the iperf3
// client and server used.
func (m *meter) tcp(ctx context.Context, p *path, streams int) ([]float64, error) {
	rep, err := m.iperfRun(ctx, p, "-t", strconv.Itoa(m.seconds), "-P", strconv.Itoa(streams))
	if err != nil {
		return nil, err
	}
	gbps := rep.End.SumReceived.BitsPerSecond / 1e9
	cpu := (rep.End.CPU.Host + rep.End.CPU.Remote) / 100
	if cpu <= 0 {
		return nil, errors.New("iperf3 reported no CPU utilisation")
	}
	return []float64{gbps, gbps / cpu}, nil
}

// udp is the rate of small UDP datagrams that arrived, in thousands per
// second, sent as fast as the client can.
func (m *meter) udp(ctx context.Context, p *path) ([]float64, error) {
	rep, err := m.iperfRun(ctx, p, "-u", "-b", "0", "-l", strconv.Itoa(udpPayload), "-t", strconv.Itoa(m.seconds))
	if err != nil {
		return nil, err
	}
	s := rep.End.Sum
	if s.Seconds <= 0 {
		return nil, errors.New("iperf3 reported no UDP summary")
	}
	return []float64{float64(s.Packets-s.LostPackets) / s.Seconds / 1e3}, nil
}

// rtt is the median round trip of m.pings echoes, one after the other, in
// milliseconds.
func (m *meter) rtt(ctx context.Context, p *path) ([]float64, error) {
	var rtts []float64
	for range m.pings {
		_, d, err := p.from.PingEchoes(ctx, p.addr, 3)
		if err != nil {
			return nil, err
		}
		rtts = append(rtts, float64(d)/float64(time.Millisecond))
	}
	return []float64{median(rtts)}, nil
}

// median of a non-empty list.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// linkMTUs describes the MTUs on the way: the container's interface, the
// VTEP's and the underlay's, for the table's title.
func linkMTUs(container, host *netnslab.Namespace, vtep string) (string, error) {
	var out [3]int
	for i, q := range []struct {
		n    *netnslab.Namespace
		link string
	}{{container, netnslab.ContainerLink}, {host, vtep}, {host, netnslab.HostLink}} {
		v, err := q.n.LinkMTU(q.link)
		if err != nil {
			return "", err
		}
		out[i] = v
	}
	return fmt.Sprintf("MTU: container %d, VTEP %d, underlay %d", out[0], out[1], out[2]), nil
}
