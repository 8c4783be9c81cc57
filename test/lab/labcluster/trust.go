package labcluster

import (
	"fmt"
	"net/http"

	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/pki"
)

// PKIDir is the directory of the cluster's CA and of every certificate the
// harness issued (NAME.pem, NAME-key.pem): `carve certs revoke --dir`.
func (c *Cluster) PKIDir() string { return c.sec.dir }

// IssueAgentCertificate issues h's agent a new certificate (a new serial)
// for its name and underlay IP, in place of the one it runs with: what an
// operator does for a host whose certificate was revoked. Reload the agent
// to have it present the new one.
func (c *Cluster) IssueAgentCertificate(h *Host) error {
	return c.sec.issue(pki.RoleAgent, h.CertName(), h.IP().Addr())
}

// AgentFiles are the CA, certificate and key h's agent runs with: what a
// test acting as that host (a compromised one) presents.
func (c *Cluster) AgentFiles(h *Host) pki.Files { return c.sec.files(h.CertName()) }

// ClientAs is a client of the masters (every master, with failover, or
// only those of urls) that presents files' certificate, dialling from the
// underlay like the harness's own.
func (c *Cluster) ClientAs(files pki.Files, urls ...string) (*apiclient.Client, error) {
	hc, err := c.HTTPClientAs(files)
	if err != nil {
		return nil, err
	}
	if len(urls) == 0 {
		urls = c.MasterURLs()
	}
	cl, err := apiclient.NewClient(urls, hc)
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	return cl, nil
}

// HTTPClientAs is an HTTP client that presents files' certificate (none
// when files.Cert is empty: only the CA), dialling from the underlay.
func (c *Cluster) HTTPClientAs(files pki.Files) (*http.Client, error) {
	cfg, err := files.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("labcluster: %w", err)
	}
	return newHTTPClient(c.Lab.Underlay, cfg), nil
}
