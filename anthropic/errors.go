package anthropic

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
)

// invalid is a 400 invalid_request_error.
func invalid(format string, args ...any) *apierror.Error {
	return apierror.BadRequest("", format, args...)
}

// errorType is Anthropic's error.type for an HTTP status.
func errorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// errorBody is Anthropic's error envelope.
type errorBody struct {
	Type      string      `json:"type"` // always "error"
	Error     errorDetail `json:"error"`
	RequestID string      `json:"request_id,omitempty"`
}

type errorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func marshalError(status int, msg, requestID string) []byte {
	b, _ := json.Marshal(errorBody{Type: "error", Error: errorDetail{Type: errorType(status), Message: msg}, RequestID: requestID})
	return b
}

// writeError is the only writer of this package's error responses: it maps
// err with apierror.From (keeping its status and extra headers, such as
// Retry-After and x-ratelimit-*) and writes Anthropic's envelope, unless
// the client has gone. It returns the mapped error for logging.
func writeError(w http.ResponseWriter, err error, requestID string) *apierror.Error {
	he := apierror.From(err)
	if he.Status == apierror.StatusClientClosed {
		return he
	}
	h := w.Header()
	for k, v := range he.Header {
		h[k] = v
	}
	if (he.Status == http.StatusServiceUnavailable || he.Status == http.StatusBadGateway) && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(he.Status)
	_, _ = w.Write(append(marshalError(he.Status, he.Msg, requestID), '\n'))
	return he
}

// codeStatus maps the gateway's string error codes to their statuses.
var codeStatus = map[string]int{
	"upstream_error":      http.StatusBadGateway,
	"service_unavailable": http.StatusServiceUnavailable,
	"timeout":             http.StatusGatewayTimeout,
	"rate_limit_exceeded": http.StatusTooManyRequests,
}

// streamError is the error event of a stream that failed after its
// headers: the mid-stream error an upstream chunk carried, mapped to an
// Anthropic type by its status code when it has one.
func streamError(data []byte) (int, errorDetail) {
	e := gjson.GetBytes(data, "error")
	status := http.StatusInternalServerError
	c := e.Get("code")
	if n, err := strconv.Atoi(c.String()); err == nil {
		status = n // vLLM's integer code is the HTTP status
	} else if s, ok := codeStatus[c.String()]; ok {
		status = s
	}
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	msg := e.Get("message").String()
	if msg == "" {
		msg = fmt.Sprintf("the upstream failed mid-stream (status %d)", status)
	}
	return status, errorDetail{Type: errorType(status), Message: msg}
}
