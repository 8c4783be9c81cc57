package master

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/state"
)

// The network configuration has one authority: the committed one. A
// master's --config file is the value a new cluster starts with, committed
// by its first leader; after that the configuration changes only by an
// operator's PUT /cluster/config (carve config apply), committed through
// Raft and logged with who asked. An election never changes it: a master
// whose file differs says so (its log at start of leadership, the
// carve_master_config_file_differs metric, config_differs in
// /cluster/status) and changes nothing.

// configDiffers says how this master's file differs from the committed
// configuration, or "" when it does not (or nothing is committed yet).
func (m *Master) configDiffers() string {
	if _, ok := m.table.Network(); !ok {
		return ""
	}
	changed, _, err := m.table.ConfigChange(m.opts.Network)
	switch {
	case err != nil:
		return fmt.Sprintf("this master's --config cannot be merged into the committed network configuration (%v); the committed one stays: fix the file, or leave it as it is (it only starts a new cluster)", err)
	case changed:
		return "this master's --config file differs from the committed network configuration, which stays (the file only starts a new cluster): carve config diff FILE shows how, carve config apply FILE commits a change"
	}
	return ""
}

// commitBootstrapConfig commits this leader's file when the cluster has no
// configuration yet, and otherwise only says whether the file differs.
func (m *Master) commitBootstrapConfig(ctxApply func(logcmd.Command) (state.Result, error)) error {
	if _, ok := m.table.Network(); ok {
		// Said once per difference (this runs at every leader tick).
		why := m.configDiffers()
		if why != m.configDiffersSaid && why != "" {
			m.log.Warn("network config file not applied", "why", why)
		}
		m.configDiffersSaid = why
		return nil
	}
	res, err := ctxApply(logcmd.SetConfigCommand(m.opts.Network))
	if err != nil {
		return fmt.Errorf("commit network config: %w", err)
	}
	for _, w := range res.Warnings {
		m.log.Warn("network config", "warning", w)
	}
	m.log.Info("network config committed: the cluster starts with this master's --config", "overlays", len(m.opts.Network.Overlays))
	return nil
}

// configShow answers the committed configuration.
func (s *server) configShow(w http.ResponseWriter, _ *http.Request) {
	cfg, ok := s.m.table.Network()
	if !ok {
		httpapi.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable,
			"the cluster has no network configuration yet: its first leader commits its --config; retry")
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, api.ConfigAnswer{Config: cfg})
}

// configApply commits a configuration an operator sends (PUT
// /cluster/config), merged as every configuration is; with ?dry_run=true
// any master answers what it would change and commits nothing.
func (s *server) configApply() http.HandlerFunc {
	apply := handleWrite(s, write[api.NetworkConfig, state.Result]{
		body: true,
		prepare: func(r *http.Request, cfg *api.NetworkConfig) (action[state.Result], error) {
			if err := netconfig.Validate(*cfg); err != nil {
				return nil, err
			}
			who, _ := requestIdentity(r)
			s.log.Warn("network configuration change asked for", "by", who.String(), "overlays", len(cfg.Overlays))
			return s.proposal(logcmd.SetConfigCommand(*cfg)), nil
		},
		answer: func(w http.ResponseWriter, res state.Result) {
			cfg, _ := s.m.table.Network()
			httpapi.WriteJSON(w, http.StatusOK, api.ConfigAnswer{Config: cfg, Changed: res.ConfigChanged, Warnings: res.Warnings})
		},
	})
	return func(w http.ResponseWriter, r *http.Request) {
		if dry, _ := strconv.ParseBool(r.URL.Query().Get("dry_run")); !dry {
			apply(w, r)
			return
		}
		body, ok := httpapi.ReadBody(w, r)
		if !ok {
			return
		}
		var cfg api.NetworkConfig
		if err := api.DecodeStrict(bytes.NewReader(body), &cfg); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		if err := netconfig.Validate(cfg); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		changed, warnings, err := s.m.table.ConfigChange(cfg)
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
			return
		}
		cur, _ := s.m.table.Network()
		httpapi.WriteJSON(w, http.StatusOK, api.ConfigAnswer{Config: cur, Changed: changed, Warnings: warnings, DryRun: true})
	}
}
