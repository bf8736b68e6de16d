package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/tidwall/gjson"
)

// httpError is an error with an HTTP status and an OpenAI error type. Msg
// goes to the client; Err (when set) only to the log.
type httpError struct {
	Status int
	Type   string // OpenAI error type, e.g. "invalid_request_error"
	Code   string // OpenAI error code; "" is sent as null
	Param  string // offending parameter; "" is sent as null
	Msg    string
	Err    error
}

func (e *httpError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%d %s: %v", e.Status, e.Msg, e.Err)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Msg)
}

func (e *httpError) Unwrap() error { return e.Err }

// Constructors for the errors the gateway itself raises.

func badRequest(param, format string, args ...any) *httpError {
	return &httpError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Msg: fmt.Sprintf(format, args...)}
}

func notFound(code, format string, args ...any) *httpError {
	return &httpError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: code, Msg: fmt.Sprintf(format, args...)}
}

func unavailable(err error, format string, args ...any) *httpError {
	return &httpError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "service_unavailable", Msg: fmt.Sprintf(format, args...), Err: err}
}

func badGateway(err error, format string, args ...any) *httpError {
	return &httpError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_error", Msg: fmt.Sprintf(format, args...), Err: err}
}

// statusClientClosed is nginx's "client closed request", logged and counted
// when the client goes away; the client never sees it.
const statusClientClosed = 499

// errorEnvelope is OpenAI's error body; every key is always present.
type errorEnvelope struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// asHTTPError maps any error onto the status and body the client gets.
func asHTTPError(err error) *httpError {
	if he, ok := errors.AsType[*httpError](err); ok {
		return he
	}
	switch {
	case errors.Is(err, context.Canceled):
		return &httpError{Status: statusClientClosed, Type: "invalid_request_error", Msg: "client closed request", Err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &httpError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "timeout", Msg: "upstream timed out", Err: err}
	}
	if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return &httpError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Msg: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), Err: err}
	}
	return &httpError{Status: http.StatusInternalServerError, Type: "server_error", Msg: "internal error", Err: err}
}

// writeError is the only writer of gateway-made error responses.
func writeError(w http.ResponseWriter, err error) *httpError {
	he := asHTTPError(err)
	if he.Status == statusClientClosed {
		return he // nobody is listening
	}
	body, _ := json.Marshal(errorEnvelope{Error: errorBody{Message: he.Msg, Type: he.Type, Param: strOrNil(he.Param), Code: strOrNil(he.Code)}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if he.Status == http.StatusServiceUnavailable || he.Status == http.StatusBadGateway {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(he.Status)
	_, _ = w.Write(append(body, '\n'))
	return he
}

// normalizeErrorBody rewrites an upstream error body into OpenAI's envelope:
// vLLM sends an integer code (the HTTP status), older releases an
// unwrapped {"object":"error",…} object, and a dead proxy plain text. It
// returns nil when body is already a proper envelope.
func normalizeErrorBody(status int, body []byte) []byte {
	var root gjson.Result
	if gjson.ValidBytes(body) {
		root = gjson.ParseBytes(body)
	}
	e := root.Get("error")
	wrapped := e.IsObject()
	if !wrapped && root.Get("object").String() == "error" {
		e = root
	}
	var eb errorBody
	if e.IsObject() {
		if m := e.Get("message"); m.Type == gjson.String {
			eb.Message = m.String()
		}
		eb.Type = e.Get("type").String()
		if p := e.Get("param"); p.Type == gjson.String && p.String() != "" {
			eb.Param = strOrNil(p.String())
		}
		if c := e.Get("code"); c.Type == gjson.String && c.String() != "" {
			eb.Code = strOrNil(c.String())
		}
		if wrapped && e.Get("message").Type == gjson.String && e.Get("type").Type == gjson.String &&
			stringOrNull(e.Get("param")) && stringOrNull(e.Get("code")) {
			return nil // already OpenAI-shaped
		}
	} else {
		eb.Message = string(body)
		if len(eb.Message) > 512 {
			eb.Message = eb.Message[:512]
		}
	}
	if eb.Message == "" {
		eb.Message = http.StatusText(status)
	}
	if eb.Type == "" {
		eb.Type = errorTypeFor(status)
	}
	if eb.Code == nil {
		eb.Code = codeFor(status)
	}
	out, _ := json.Marshal(errorEnvelope{Error: eb})
	return out
}

func stringOrNull(r gjson.Result) bool {
	return r.Exists() && (r.Type == gjson.String || r.Type == gjson.Null)
}

func errorTypeFor(status int) string {
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

// codeFor gives OpenAI's string code for statuses that have a well-known
// one, nil otherwise.
func codeFor(status int) *string {
	switch status {
	case http.StatusNotFound:
		return strOrNil("model_not_found")
	case http.StatusTooManyRequests:
		return strOrNil("rate_limit_exceeded")
	case http.StatusServiceUnavailable:
		return strOrNil("service_unavailable")
	}
	return nil
}
