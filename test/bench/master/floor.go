package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// floorRun answers registrations from a server that keeps no state and
// runs no Raft: it reads and strictly decodes each request and answers it
// with the record a master answered in the cluster rows (answer), given
// the request's agent and signed for it (one ed25519 signature, as a
// master signs each record it leases), over the same TLS (a master's
// certificate, client certificates required), through the same clients.
// What a request costs here, any design of the masters pays before its
// log and state machine: the floor under the registration rows' CPU, on
// this machine, with the clients on the same cores.
func floorRun(sec *security, clients, total int, answer api.AgentInfo, clusterID string) (registrationRun, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return registrationRun{}, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /overlay-master/agents", func(w http.ResponseWriter, r *http.Request) {
		var req api.RegisterRequest
		if err := api.DecodeStrict(r.Body, &req); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		info := answer
		info.AgentID, info.IP = req.AgentID, req.IP
		if sec != nil {
			info.Signature = api.Sign(sec.signingKey, api.RecordSigningBytes(&info, clusterID))
		}
		httpapi.WriteJSON(w, http.StatusOK, &info)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	scheme := "http"
	if sec != nil {
		scheme = "https"
		files := pki.Files{CA: filepath.Join(sec.dir, pki.CAFile), Cert: pki.CertFile(sec.dir, "m1"), Key: pki.KeyFile(sec.dir, "m1")}
		if srv.TLSConfig, err = files.ServerConfig(true); err != nil {
			ln.Close()
			return registrationRun{}, err
		}
	}
	served := make(chan error, 1)
	go func() {
		if sec != nil {
			served <- srv.ServeTLS(ln, "", "")
		} else {
			served <- srv.Serve(ln)
		}
	}()
	defer func() {
		srv.Close()
		<-served
	}()
	url := scheme + "://" + ln.Addr().String()
	var cls []*apiclient.Client
	var transports []*http.Transport
	defer func() {
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}()
	for range clients {
		tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, TLSClientConfig: sec.clientTLS()}
		transports = append(transports, tr)
		cl, err := apiclient.NewClient([]string{url}, &http.Client{Transport: tr, Timeout: time.Minute})
		if err != nil {
			return registrationRun{}, err
		}
		cls = append(cls, cl)
	}
	if len(cls) == 0 {
		return registrationRun{}, errors.New("no clients")
	}
	// Every client's connection is open before the clock starts, as in
	// the cluster rows.
	ctx := context.Background()
	var warm sync.WaitGroup
	warmErrs := make(chan error, len(cls))
	for w, cl := range cls {
		warm.Go(func() {
			if _, err := cl.Register(ctx, api.RegisterRequest{AgentID: fmt.Sprintf("warm-%04d", w), IP: "198.19.0.1"}); err != nil {
				warmErrs <- err
			}
		})
	}
	warm.Wait()
	close(warmErrs)
	if err := <-warmErrs; err != nil {
		return registrationRun{}, fmt.Errorf("open the clients' connections: %w", err)
	}
	elapsed, used, err := drive(cls, total, func(cl *apiclient.Client, req api.RegisterRequest) error {
		got, err := cl.Register(ctx, req)
		if err == nil && got.AgentID != req.AgentID {
			err = fmt.Errorf("answered agent %q for %q", got.AgentID, req.AgentID)
		}
		return err
	})
	if err != nil {
		return registrationRun{}, err
	}
	return registrationRun{elapsed: elapsed, cpu: used}, nil
}
