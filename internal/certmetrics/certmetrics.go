// Package certmetrics exports how long a component's certificates stay
// valid, carve_cert_expiry_seconds, read from their files at every scrape
// (a renewed file shows at once).
package certmetrics

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/pki"
)

// desc is carve_cert_expiry_seconds{cert}: cert is the certificate's
// role/name, or "ca" for the CA that expires first (of --ca-file).
var desc = prometheus.NewDesc("carve_cert_expiry_seconds",
	"Seconds until the certificate expires (negative: expired), read from its file at every scrape; cert is its role/name, or ca for the soonest-expiring CA of --ca-file.",
	[]string{"cert"}, nil)

// collector reads the files at every scrape.
type collector struct {
	files pki.Files
	now   func() time.Time
}

// New returns the collector of files' certificate and CA (either may be
// empty: not exported).
func New(files pki.Files) prometheus.Collector {
	return &collector{files: files, now: time.Now}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- desc }

// Collect exports what it can read; a file that cannot be read is left
// out (the component logged it at start, or is being renewed).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	if c.files.Cert != "" {
		if cert, err := pki.ReadCertificate(c.files.Cert); err == nil {
			label := cert.Subject.CommonName
			if id, err := pki.IdentityOf(cert); err == nil {
				label = id.String()
			}
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, cert.NotAfter.Sub(now).Seconds(), label)
		}
	}
	if c.files.CA != "" {
		if first, ok := soonestExpiry(c.files.CA); ok {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, first.Sub(now).Seconds(), "ca")
		}
	}
}

// soonestExpiry is the earliest NotAfter of the certificates of a PEM
// file (a CA bundle holds several during a rotation).
func soonestExpiry(path string) (time.Time, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	var first time.Time
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		if first.IsZero() || cert.NotAfter.Before(first) {
			first = cert.NotAfter
		}
	}
	return first, !first.IsZero()
}
