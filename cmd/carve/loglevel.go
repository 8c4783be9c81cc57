package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/loglevel"
	"github.com/carve-net/carve/internal/opclient"
)

// runLogLevel reads or sets the log level of a running master or agent
// (GET|PUT /log-level on its HTTP API), without a restart.
func runLogLevel(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve log-level")
	target := fs.String("url", "", "the API of the master (https://198.18.0.1:8080) or agent (https://198.18.0.11:9797) to ask")
	level := fs.String("level", "", "the level to set: debug, info, warn or error (default: print the level now)")
	tlsFiles := opclient.TLSFlags(fs, "an operator certificate of the cluster CA (carve certs issue --role operator --name NAME)")
	insecure := fs.Bool("insecure", false, "talk to a master or agent that runs --insecure (plain HTTP, no certificate)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the answer")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("%w: --url %q: want the API URL of a master or agent, like https://198.18.0.1:8080", cli.ErrUsage, *target)
	}
	if *level != "" {
		if _, err := loglevel.Parse(*level); err != nil {
			return fmt.Errorf("%w: --level: %v", cli.ErrUsage, err)
		}
	}
	if err := opclient.CheckSecurityFlags(*tlsFiles, *insecure, true); err != nil {
		return err
	}
	client := &http.Client{Timeout: *timeout}
	if !*insecure {
		tlsConfig, err := tlsFiles.ClientConfig()
		if err != nil {
			return err
		}
		client.Transport = &http.Transport{TLSClientConfig: tlsConfig}
	}
	endpoint := strings.TrimSuffix(*target, "/") + loglevel.Path
	var got loglevel.Body
	if *level == "" {
		err = api.Call(ctx, client, http.MethodGet, endpoint, nil, &got, nil)
	} else {
		err = api.Call(ctx, client, http.MethodPut, endpoint, loglevel.Body{Level: *level}, &got, nil)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", endpoint, err)
	}
	fmt.Fprintln(out, got.Level)
	return nil
}
