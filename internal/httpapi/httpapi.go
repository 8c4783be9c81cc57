// Package httpapi holds what every carve HTTP server shares: one router
// style (gorilla/mux, with JSON answers for unknown routes and methods), one
// way to write JSON and errors, and one strict body decoder.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
)

// MaxBodyBytes is the largest request body a carve server reads.
const MaxBodyBytes = 1 << 20

// NewRouter returns a router whose unknown routes answer 404 and whose known
// routes called with another method answer 405, both as JSON errors.
func NewRouter() *mux.Router {
	r := mux.NewRouter()
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusMethodNotAllowed, api.CodeBadRequest, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
	})
	return r
}

// WriteJSON writes v as the JSON answer with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes the JSON error answer {"error","code"}; a 503 also says
// when to retry.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	WriteJSON(w, status, api.Error{Message: msg, Code: code})
}

// ReadBody reads a request body of at most MaxBodyBytes; false means an
// error answer (413, or 400) was written.
func ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			WriteError(w, http.StatusRequestEntityTooLarge, api.CodeTooLarge, fmt.Sprintf("request body larger than %d bytes", MaxBodyBytes))
			return nil, false
		}
		WriteError(w, http.StatusBadRequest, api.CodeBadRequest, fmt.Sprintf("read request body: %v", err))
		return nil, false
	}
	return body, true
}

// DecodeBody strictly decodes a body already read (unknown fields refused);
// false means a 400 answer naming the problem was written.
func DecodeBody(w http.ResponseWriter, body []byte, v any) bool {
	if err := api.DecodeStrict(bytes.NewReader(body), v); err != nil {
		WriteError(w, http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return false
	}
	return true
}

// Decode reads and strictly decodes a request body; false means an error
// answer was written.
func Decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, ok := ReadBody(w, r)
	return ok && DecodeBody(w, body, v)
}
