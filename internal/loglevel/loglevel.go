// Package loglevel is the runtime log level of carve's daemons (masters and
// agents): the level variable behind their logger and the operator
// endpoint GET|PUT /log-level that reads and changes it without a restart.
package loglevel

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// Path is the endpoint's route on a master's and an agent's HTTP API.
const Path = "/log-level"

// Body is the endpoint's request and answer: {"level":"debug"}.
type Body struct {
	Level string `json:"level"`
}

// Parse reads debug, info, warn or error (any case).
func Parse(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil || !known(l) {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func known(l slog.Level) bool {
	switch l {
	case slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError:
		return true
	}
	return false
}

// Name is a level as Parse reads it.
func Name(l slog.Level) string { return strings.ToLower(l.String()) }

// Handler serves GET (the level now) and PUT (a new level, logged at WARN
// with who set it) on level. With TLS only an operator's certificate may
// use it: a debug level makes a daemon log much more, which is an
// operator's decision, and its logs are the operator's to read.
func Handler(level *slog.LevelVar, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who := "anyone (no TLS)"
		if r.TLS != nil {
			id, ok := pki.PeerIdentity(r)
			if !ok || id.Role != pki.RoleOperator {
				httpapi.WriteError(w, http.StatusForbidden, api.CodeForbidden,
					fmt.Sprintf("%s %s needs an operator certificate (carve certs issue --role operator)", r.Method, Path))
				return
			}
			who = id.Name
		}
		switch r.Method {
		case http.MethodGet:
		case http.MethodPut:
			var body Body
			if !httpapi.Decode(w, r, &body) {
				return
			}
			l, err := Parse(body.Level)
			if err != nil {
				httpapi.WriteError(w, http.StatusBadRequest, api.CodeBadRequest, "level: "+err.Error())
				return
			}
			old := level.Level()
			level.Set(l)
			log.Warn("log level changed", "from", Name(old), "to", Name(l), "by", who)
		default:
			httpapi.WriteError(w, http.StatusMethodNotAllowed, api.CodeBadRequest, "GET or PUT "+Path)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, Body{Level: Name(level.Level())})
	}
}
