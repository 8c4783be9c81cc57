package master

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A master whose disk is full cannot append to its Raft log: as a follower
// it logs `no space left on device` and applies nothing new while the
// others go on, and the lag that carve cluster status judges grows only as
// fast as the cluster writes (slowly, in a quiet one). So the master checks
// its data dir itself: every dataDirProbeInterval it writes, syncs and
// removes a file of dataDirProbeBytes there, and says whether that failed
// (data_dir_error in /cluster/status, which carve cluster status reports
// as a problem; carve_master_data_dir_writable).

const (
	// dataDirProbeInterval is how often the data dir is checked.
	dataDirProbeInterval = 10 * time.Second
	// dataDirProbeBytes is what a probe writes: more than a Raft batch's
	// pages, so that a disk too full for the next append fails it.
	dataDirProbeBytes = 64 << 10
	// dataDirProbeFile is the probe's file in the data dir.
	dataDirProbeFile = ".write-probe"
)

// dataDirHealth is the last probe's outcome.
type dataDirHealth struct {
	writable prometheus.Gauge

	mu  sync.Mutex
	err string // "" when the last probe wrote
}

func newDataDirHealth(reg prometheus.Registerer) *dataDirHealth {
	h := &dataDirHealth{writable: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "carve_master_data_dir_writable",
		Help: "1 when this master's last probe wrote, synced and removed a file in its --data-dir, 0 when it failed (a full or read-only disk: the Raft log cannot grow).",
	})}
	h.writable.Set(1)
	reg.MustRegister(h.writable)
	return h
}

// problem is why the data dir cannot be written, or "" (also before the
// first probe).
func (h *dataDirHealth) problem() string {
	if h == nil {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *dataDirHealth) record(dir string, err error) {
	why := ""
	if err != nil {
		why = fmt.Sprintf("cannot write its --data-dir %s (%v): its Raft log cannot grow, it falls behind the others; free or grow its disk", dir, err)
	}
	h.mu.Lock()
	h.err = why
	h.mu.Unlock()
	if err != nil {
		h.writable.Set(0)
	} else {
		h.writable.Set(1)
	}
}

// probeDataDir checks the data dir now and every dataDirProbeInterval
// until ctx ends, logging each change of its outcome.
func (m *Master) probeDataDir(ctx context.Context) {
	t := time.NewTicker(dataDirProbeInterval)
	defer t.Stop()
	said := ""
	for {
		err := writeProbe(m.opts.DataDir)
		m.dataDir.record(m.opts.DataDir, err)
		switch why := m.dataDir.problem(); {
		case why != "" && why != said:
			m.log.Error("data dir not writable", "data_dir", m.opts.DataDir, "err", err)
		case why == "" && said != "":
			m.log.Info("data dir writable again", "data_dir", m.opts.DataDir)
		}
		said = m.dataDir.problem()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeProbe writes, syncs and removes a file of dataDirProbeBytes in dir.
func writeProbe(dir string) (err error) {
	path := filepath.Join(dir, dataDirProbeFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
		if rerr := os.Remove(path); err == nil && rerr != nil {
			err = fmt.Errorf("remove %s: %w", path, rerr)
		}
	}()
	if _, err := f.Write(make([]byte, dataDirProbeBytes)); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
