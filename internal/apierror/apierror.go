// Package apierror owns the error every warmpath HTTP surface returns: an
// HTTP status with OpenAI's error envelope
// {"error":{"message","type","param","code"}}. Handlers return errors; one
// writer ([Write]) maps any error onto a status and body, so the mapping
// lives in one place. Msg goes to the client, Err only to the log.
//
// The package keeps no state and runs no goroutines.
package apierror

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Error is an error with an HTTP status and an OpenAI error type. Msg goes
// to the client; Err (when set) only to the log.
type Error struct {
	Status int
	Type   string // OpenAI error type, e.g. "invalid_request_error"
	Code   string // OpenAI error code; "" is sent as null
	Param  string // offending parameter; "" is sent as null
	Msg    string
	Err    error
	// Header holds extra response headers (Retry-After, x-ratelimit-*).
	Header http.Header
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%d %s: %v", e.Status, e.Msg, e.Err)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// StatusClientClosed is nginx's "client closed request", logged and counted
// when the client goes away; the client never sees it.
const StatusClientClosed = 499

// Types of the OpenAI envelope.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeRateLimit      = "rate_limit_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
)

// BadRequest is a 400 invalid_request_error naming the offending parameter.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: param, Msg: fmt.Sprintf(format, args...)}
}

// NotFound is a 404 with the given code.
func NotFound(code, format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Unavailable is a 503 service_unavailable; err goes to the log.
func Unavailable(err error, format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeServer, Code: "service_unavailable", Msg: fmt.Sprintf(format, args...), Err: err}
}

// BadGateway is a 502 upstream_error; err goes to the log.
func BadGateway(err error, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadGateway, Type: TypeServer, Code: "upstream_error", Msg: fmt.Sprintf(format, args...), Err: err}
}

// Envelope is OpenAI's error body; every key is always present.
type Envelope struct {
	Error Body `json:"error"`
}

// Body is the inside of an Envelope; nil Param and Code are sent as null.
type Body struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// OrNil returns nil for "" and &s otherwise, for Body's nullable fields.
func OrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// From maps any error onto the status and body the client gets: an *Error
// as it is; a canceled context as 499; a deadline as 504; an over-long body
// as 413; anything else as a 500 whose cause stays in the log.
func From(err error) *Error {
	if he, ok := errors.AsType[*Error](err); ok {
		return he
	}
	switch {
	case errors.Is(err, context.Canceled):
		return &Error{Status: StatusClientClosed, Type: TypeInvalidRequest, Msg: "client closed request", Err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusGatewayTimeout, Type: TypeServer, Code: "timeout", Msg: "upstream timed out", Err: err}
	}
	if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: "request_too_large",
			Msg: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), Err: err}
	}
	return &Error{Status: http.StatusInternalServerError, Type: TypeServer, Msg: "internal error", Err: err}
}

// Marshal returns e's envelope as JSON.
func (e *Error) Marshal() []byte {
	b, _ := json.Marshal(Envelope{Error: Body{Message: e.Msg, Type: e.Type, Param: OrNil(e.Param), Code: OrNil(e.Code)}})
	return b
}

// Write is the only writer of warmpath-made error responses: it maps err
// with From and writes the envelope, unless the client has gone (499). It
// returns the mapped error for logging and metrics.
func Write(w http.ResponseWriter, err error) *Error {
	he := From(err)
	if he.Status == StatusClientClosed {
		return he // nobody is listening
	}
	h := w.Header()
	for k, v := range he.Header {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if (he.Status == http.StatusServiceUnavailable || he.Status == http.StatusBadGateway) && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(he.Status)
	_, _ = w.Write(append(he.Marshal(), '\n'))
	return he
}

// maxErrorBody bounds the error body FromResponse reads.
const maxErrorBody = 1 << 20

// FromResponse is the error an upstream error response (status >= 400)
// stands for, read once where it leaves the routed client: its status;
// the message, type, param and code of OpenAI's envelope (vLLM's integer
// code becomes null; vLLM's older {"object":"error","message"} and a text
// body give the message, cut to 512 bytes); and the headers SDKs read for
// retries (Retry-After, retry-after-ms, x-should-retry, x-ratelimit-*).
// It reads and closes resp's body.
func FromResponse(resp *http.Response) *Error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var env struct {
		Error struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Param   *string         `json:"param"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
		Message string `json:"message"`
	}
	isJSON := json.Unmarshal(b, &env) == nil
	e := &Error{Status: resp.StatusCode, Type: env.Error.Type, Msg: env.Error.Message,
		Err: fmt.Errorf("upstream answered %d", resp.StatusCode), Header: http.Header{}}
	if env.Error.Param != nil {
		e.Param = *env.Error.Param
	}
	var code string
	if json.Unmarshal(env.Error.Code, &code) == nil {
		e.Code = code
	}
	switch {
	case e.Msg != "":
	case env.Message != "":
		e.Msg = env.Message
	case !isJSON && len(bytes.TrimSpace(b)) > 0:
		e.Msg = string(b[:min(len(b), 512)])
	default:
		e.Msg = fmt.Sprintf("the model answered %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	}
	if e.Type == "" {
		e.Type = TypeServer
		if resp.StatusCode < 500 {
			e.Type = TypeInvalidRequest
		}
	}
	for k, v := range resp.Header {
		lk := strings.ToLower(k)
		if lk == "retry-after" || lk == "retry-after-ms" || lk == "x-should-retry" || strings.HasPrefix(lk, "x-ratelimit-") {
			e.Header[k] = v
		}
	}
	return e
}
