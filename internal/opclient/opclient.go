// Package opclient reaches carve's masters and agents for the operator
// commands (carve ipam, carve cluster, carve certs check-*, ...): the
// --masters and TLS flags and their checks, the masters' client built from
// them (which accepts only servers of role master), every master's status
// (those given and those they name), the agents' HTTP APIs read at their
// underlay IPs, and the masters' state read within a timeout.
package opclient

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/pki"
)

// MasterFlags are the flags of a command that talks to the masters:
// --masters, --ca-file, --cert-file, --key-file and --insecure.
type MasterFlags struct {
	Masters  *string
	TLS      *pki.Files
	Insecure *bool
}

// AddMasterFlags defines the flags; certHelp says which certificate
// --cert-file must be.
func AddMasterFlags(fs *flag.FlagSet, certHelp string) *MasterFlags {
	return &MasterFlags{
		Masters:  fs.String("masters", "", "master URLs, comma separated"),
		TLS:      TLSFlags(fs, certHelp),
		Insecure: fs.Bool("insecure", false, "talk to masters (and agents) that run --insecure (plain HTTP, no certificate)"),
	}
}

// Client checks the flags and returns a client for the masters and the
// options it was made with, for more clients alike (TLS is nil with
// --insecure).
func (f *MasterFlags) Client() (*apiclient.Client, apiclient.ClientOptions, error) {
	var opts apiclient.ClientOptions
	urls, err := SplitMasters(*f.Masters)
	if err != nil {
		return nil, opts, err
	}
	if err := CheckSecurityFlags(*f.TLS, *f.Insecure, true); err != nil {
		return nil, opts, err
	}
	if !*f.Insecure {
		if opts.TLS, err = f.TLS.ClientConfig(); err != nil {
			return nil, opts, err
		}
		opts.TLS.VerifyConnection = RequireMaster
	}
	c, err := apiclient.NewClientWith(urls, opts)
	if err != nil {
		return nil, opts, fmt.Errorf("%w: --masters: %v", cli.ErrUsage, err)
	}
	return c, opts, nil
}

// TLSFlags defines --ca-file, --cert-file and --key-file; certHelp says
// which certificate --cert-file is.
func TLSFlags(fs *flag.FlagSet, certHelp string) *pki.Files {
	var f pki.Files
	fs.StringVar(&f.CA, "ca-file", "", "the cluster CA certificate (ca.pem of carve certs ca): every peer's certificate is verified against it")
	fs.StringVar(&f.Cert, "cert-file", "", certHelp)
	fs.StringVar(&f.Key, "key-file", "", "the private key of --cert-file")
	return &f
}

// CheckSecurityFlags refuses --insecure beside TLS files, and TLS files
// that are missing (needCert: the certificate and key too), naming the flags.
func CheckSecurityFlags(f pki.Files, insecure, needCert bool) error {
	if insecure {
		if f.Enabled() {
			return fmt.Errorf("%w: --insecure contradicts --ca-file/--cert-file/--key-file: give one or the other", cli.ErrUsage)
		}
		return nil
	}
	if err := f.Check(needCert); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	return nil
}

// SplitMasters parses --masters.
func SplitMasters(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --masters is required (URL[,URL...])", cli.ErrUsage)
	}
	if _, err := apiclient.NewClient(out, nil); err != nil {
		return nil, fmt.Errorf("%w: --masters: %v", cli.ErrUsage, err)
	}
	return out, nil
}

// RequireMaster is the VerifyConnection of every operator command's
// connections to the masters: a certificate of the CA is not enough (an
// agent's would do), the server's must carry role master, or whoever
// holds another could answer as the masters.
func RequireMaster(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return errors.New("not a master: the server gave no verified certificate")
	}
	id, err := pki.IdentityOf(cs.VerifiedChains[0][0])
	if err != nil {
		return fmt.Errorf("not a master: the server's certificate carries no carve role (%w)", err)
	}
	if id.Role != pki.RoleMaster {
		return fmt.Errorf("not a master: the server's certificate is %s (role %s): --masters must name masters, whose certificates carry role master", id, id.Role)
	}
	return nil
}

// DefaultAgentPort is the port of the agents' HTTP API that carve ipam
// reaches at each agent's underlay IP (carve agent --http-addr IP:9797).
const DefaultAgentPort = 9797

// maxAgentReads bounds the agents read at once.
const maxAgentReads = 16

// AgentFlags are the flags of a command that reads the agents' HTTP APIs
// as well as the masters.
type AgentFlags struct {
	Masters *MasterFlags
	Port    *int
	Timeout *time.Duration
}

// AddAgentFlags defines the master flags (a certificate of role operator or
// agent), --agent-port and --timeout.
func AddAgentFlags(fs *flag.FlagSet) *AgentFlags {
	return &AgentFlags{
		Masters: AddMasterFlags(fs, "a certificate of the cluster CA, role operator or agent (carve certs issue --role operator --name NAME): presented to the masters and the agents"),
		Port:    fs.Int("agent-port", DefaultAgentPort, "port of the agents' HTTP API, reached at each agent's underlay IP (the port of carve agent --http-addr)"),
		Timeout: fs.Duration("timeout", 10*time.Second, "how long to wait for the masters and for each agent"),
	}
}

// Cluster checks the flags and returns a client for the masters and a
// reader of the agents.
func (f *AgentFlags) Cluster() (*apiclient.Client, *AgentReader, error) {
	if *f.Port < 1 || *f.Port > 65535 {
		return nil, nil, fmt.Errorf("%w: --agent-port %d: want 1-65535", cli.ErrUsage, *f.Port)
	}
	if *f.Timeout <= 0 {
		return nil, nil, fmt.Errorf("%w: --timeout %s: want a positive duration", cli.ErrUsage, *f.Timeout)
	}
	client, opts, err := f.Masters.Client()
	if err != nil {
		return nil, nil, err
	}
	return client, &AgentReader{Port: *f.Port, TLS: opts.TLS, Timeout: *f.Timeout}, nil
}

// AgentReader reads agents' HTTP APIs at their underlay IPs: over https
// with the operator's certificate, accepting only the certificate of the
// agent named in the masters' record.
type AgentReader struct {
	Port    int
	TLS     *tls.Config // nil: plain http (--insecure)
	Timeout time.Duration
}

// Client returns a client for agent a and a function that releases it.
func (r *AgentReader) Client(a api.AgentInfo) (*api.AgentClient, func(), error) {
	if !a.HasIP() {
		return nil, nil, errors.New("the masters' state gives it no underlay IP (another agent took it over)")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
		cfg := r.TLS.Clone()
		want := pki.Identity{Role: pki.RoleAgent, Name: a.AgentID}
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("the agent gave no verified certificate")
			}
			id, err := pki.IdentityOf(cs.VerifiedChains[0][0])
			if err != nil {
				return fmt.Errorf("the agent's certificate: %w", err)
			}
			if id != want {
				return fmt.Errorf("the certificate at %s is %s, want %s", a.IP, id, want)
			}
			return nil
		}
		tr.TLSClientConfig = cfg
	}
	base := scheme + net.JoinHostPort(a.IP, strconv.Itoa(r.Port))
	return api.NewAgentClient(base, &http.Client{Transport: tr, Timeout: r.Timeout}), tr.CloseIdleConnections, nil
}

// ReadAgents calls read for every agent, at most maxAgentReads at once,
// and returns the errors by agent id.
func (r *AgentReader) ReadAgents(ctx context.Context, agents []api.AgentInfo, read func(context.Context, *api.AgentClient, api.AgentInfo) error) map[string]string {
	failed := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxAgentReads)
	for _, a := range agents {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			err := func() error {
				c, release, err := r.Client(a)
				if err != nil {
					return err
				}
				defer release()
				ctx, cancel := context.WithTimeout(ctx, r.Timeout)
				defer cancel()
				return read(ctx, c, a)
			}()
			if err != nil {
				mu.Lock()
				failed[a.AgentID] = err.Error()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// ReadState reads the masters' state within the timeout.
func ReadState(ctx context.Context, client *apiclient.Client, timeout time.Duration) (*api.State, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := client.State(ctx, apiclient.StateOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the masters' state: %w", err)
	}
	return st, nil
}

// FindAgent returns the agent whose id is name or, failing that, whose
// underlay IP is name; nil when none.
func FindAgent(st *api.State, name string) *api.AgentInfo {
	for i := range st.Agents {
		if st.Agents[i].AgentID == name {
			return &st.Agents[i]
		}
	}
	ip, err := netip.ParseAddr(name)
	if err != nil {
		return nil
	}
	for i := range st.Agents {
		if a, err := netip.ParseAddr(st.Agents[i].IP); err == nil && a.Unmap() == ip.Unmap() {
			return &st.Agents[i]
		}
	}
	return nil
}

// MasterView is one master's answer to GET /cluster/status, or why there is none.
type MasterView struct {
	URL    string             `json:"url"`
	Status *api.ClusterStatus `json:"status,omitempty"`
	Error  string             `json:"error,omitempty"`
}

// AskMasters asks every master of mf's --masters for its status, each
// within timeout, then every server they name that answered from no given
// URL (collectMasters).
func AskMasters(ctx context.Context, mf *MasterFlags, timeout time.Duration) ([]MasterView, error) {
	client, opts, err := mf.Client()
	if err != nil {
		return nil, err
	}
	return collectMasters(ctx, client.Masters(), func(ctx context.Context, url string) (*api.ClusterStatus, error) {
		c, err := apiclient.NewClientWith([]string{url}, opts)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return c.ClusterStatus(ctx)
	}), nil
}

// collectMasters asks every given master, then every server they name
// that answered from no given URL: the masters given first, then those
// found.
func collectMasters(ctx context.Context, urls []string, ask func(context.Context, string) (*api.ClusterStatus, error)) []MasterView {
	var views []MasterView
	askAll := func(urls []string) {
		asked := make([]MasterView, len(urls))
		var wg sync.WaitGroup
		for i, u := range urls {
			wg.Go(func() {
				asked[i].URL = u
				st, err := ask(ctx, u)
				if err != nil {
					asked[i].Error = err.Error()
					return
				}
				asked[i].Status = st
			})
		}
		wg.Wait()
		views = append(views, asked...)
	}
	askAll(urls)
	// Servers known to the answers but not asked yet (by id and by URL).
	seen, answered := map[string]bool{}, map[string]bool{}
	for _, v := range views {
		seen[v.URL] = true
		if v.Status != nil {
			answered[v.Status.ID] = true
		}
	}
	var more []string
	for _, v := range views {
		if v.Status == nil {
			continue
		}
		for _, s := range v.Status.Servers {
			if !answered[s.ID] && s.URL != "" && !seen[s.URL] {
				seen[s.URL] = true
				more = append(more, s.URL)
			}
		}
	}
	askAll(more)
	return views
}
