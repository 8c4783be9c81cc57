package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// ErrUnreachable marks a call whose server could not be reached or did not
// answer at all (as opposed to one that answered with an error).
var ErrUnreachable = errors.New("unreachable")

// ErrUntrusted marks a call that failed the TLS handshake on trust: the
// server's certificate is not signed by the CA this client was given (or it
// was given none), or the server refused this client's certificate. It is a
// configuration error; retrying does not fix it.
var ErrUntrusted = errors.New("TLS trust failure")

// MaxAnswerBytes bounds the answers Call reads (a 10,000-agent state is
// about 6 MB).
const MaxAnswerBytes = 256 << 20

// Call is the tree's one JSON-over-HTTP client call: it sends in (when not
// nil) as JSON to url, decodes a 2xx answer into out (when not nil), and
// turns any other status into an *Error carrying the status and the server's
// message (`{"error","code"}`, or Docker's `{"message"}`). A failure to reach
// the server is an *Error with Status 0 that wraps ErrUnreachable.
// hdr, when not nil, receives the answer's headers on success.
func Call(ctx context.Context, hc *http.Client, method, url string, in, out any, hdr *http.Header) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request to %s: %w", url, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return fmt.Errorf("build request %s %s: %w", method, url, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return NoAnswerError(method, url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return AnswerError(method, url, resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes))
	if err != nil {
		return UnreachableError(fmt.Sprintf("read answer of %s %s: %v", method, url, err), err)
	}
	if hdr != nil {
		*hdr = resp.Header
	}
	if out == nil || len(data) == 0 && resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, url, err)
	}
	return nil
}

// NoAnswerError is the error of a request to url that got no answer (err
// is the transport's): an *Error with Status 0 that wraps ErrUntrusted,
// saying which flags fix it, when the TLS handshake failed on trust, and
// ErrUnreachable otherwise. Call and apiclient's stream share it.
func NoAnswerError(method, url string, err error) *Error {
	if msg, ok := describeTrustFailure(err); ok {
		return &Error{Message: fmt.Sprintf("%s %s: %s", method, url, msg), Code: CodeInternal,
			cause: fmt.Errorf("%w: %w", ErrUntrusted, err)}
	}
	return &Error{Message: fmt.Sprintf("%s %s: %v", method, url, err), Code: CodeInternal,
		cause: fmt.Errorf("%w: %w", ErrUnreachable, err)}
}

// UnreachableError is the error of a call whose answer was lost on the
// way (a read failed, a stream was cut): an *Error with message msg and
// Status 0 that wraps ErrUnreachable and err, so IsRetryable retries it.
func UnreachableError(msg string, err error) *Error {
	return &Error{Message: msg, Code: CodeInternal, cause: fmt.Errorf("%w: %w", ErrUnreachable, err)}
}

// AnswerError turns an answer other than 2xx into an *Error carrying the
// status and the server's message (`{"error","code"}`, or Docker's
// `{"message"}`).
func AnswerError(method, url string, resp *http.Response) error {
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes))
	if err != nil {
		return UnreachableError(fmt.Sprintf("read answer of %s %s: %v", method, url, err), err)
	}
	var wire struct {
		Error   string `json:"error"`
		Message string `json:"message"`
		Code    string `json:"code"`
		Oldest  uint64 `json:"oldest"`
		Signing string `json:"signing_key"`
	}
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(data, &wire) == nil {
		e.Message, e.Code, e.Oldest, e.SigningKey = cmp(wire.Error, wire.Message), wire.Code, wire.Oldest, wire.Signing
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("%s %s: %s", method, url, strings.TrimSpace(string(data)))
	}
	if e.Code == "" {
		e.Code = CodeInternal
	}
	return e
}

// describeTrustFailure says what to do about a TLS handshake that failed on
// trust, naming the flags that fix it; false for any other failure.
func describeTrustFailure(err error) (string, bool) {
	var unknownCA x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var hostname x509.HostnameError
	var op *net.OpError
	switch {
	case errors.As(err, &hostname):
		return fmt.Sprintf("the server's TLS certificate does not name the address dialed (%v): issue it with --ip/--dns for that address", err), true
	case errors.As(err, &unknownCA), errors.As(err, &verify):
		return fmt.Sprintf("the server's TLS certificate is not trusted (%v): give the cluster CA with --ca-file", err), true
	case errors.As(err, &op) && op.Op == "remote error" && refusedCertificate(op.Err.Error()):
		return fmt.Sprintf("the server refused this client's TLS certificate (%v): give a certificate of the cluster CA with --cert-file and --key-file", err), true
	}
	return "", false
}

// refusedCertificate tells whether a TLS alert a server sent is about the
// client's certificate (crypto/tls exports no type for received alerts).
func refusedCertificate(alert string) bool {
	for _, a := range []string{"bad certificate", "unknown certificate authority", "certificate required", "expired certificate", "unknown certificate", "unsupported certificate"} {
		if strings.HasSuffix(alert, "tls: "+a) {
			return true
		}
	}
	return false
}

// cmp returns the first non-empty string.
func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// DecodeStrict decodes exactly one JSON value from r into v, refusing
// unknown fields and trailing data, with an error that names the field.
func DecodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty body: want a JSON object")
		}
		return describeJSONError(err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// describeJSONError turns encoding/json's errors into messages naming the field.
func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "(top level)"
		}
		return fmt.Errorf("field %q: want %s, got JSON %s", field, te.Type, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("malformed JSON at byte %d: %v", se.Offset, se)
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "json: unknown field ") {
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(msg, "json: unknown field "))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("malformed JSON: unexpected end of input")
	}
	return fmt.Errorf("malformed JSON: %w", err)
}

// NewRequestID returns a random id for RegisterRequest.RequestID and friends.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// IsRetryable reports whether err is worth retrying later: the master could
// not be reached, had no leader, or timed out.
func IsRetryable(err error) bool {
	if errors.Is(err, ErrUntrusted) {
		return false // a configuration error: retrying does not fix it
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status == 0 || e.Status >= 500 || e.Code == CodeNoLeader || e.Code == CodeTimeout
	}
	return err != nil && !errors.Is(err, context.Canceled)
}

// IsCode reports whether err is an API error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
