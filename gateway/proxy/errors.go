package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
)

// NormalizeErrorBody rewrites an upstream error body into OpenAI's envelope:
// vLLM sends an integer code (the HTTP status), older releases an
// unwrapped {"object":"error",…} object, and a dead proxy plain text. It
// returns nil when body is already a proper envelope.
func NormalizeErrorBody(status int, body []byte) []byte {
	var root gjson.Result
	if gjson.ValidBytes(body) {
		root = gjson.ParseBytes(body)
	}
	e := root.Get("error")
	wrapped := e.IsObject()
	if !wrapped && root.Get("object").String() == "error" {
		e = root
	}
	var eb apierror.Body
	if e.IsObject() {
		if m := e.Get("message"); m.Type == gjson.String {
			eb.Message = m.String()
		}
		eb.Type = e.Get("type").String()
		if p := e.Get("param"); p.Type == gjson.String && p.String() != "" {
			eb.Param = apierror.OrNil(p.String())
		}
		if c := e.Get("code"); c.Type == gjson.String && c.String() != "" {
			eb.Code = apierror.OrNil(c.String())
		}
		if wrapped && e.Get("message").Type == gjson.String && openAIType[e.Get("type").String()] &&
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
	if !openAIType[eb.Type] {
		// vLLM names its Python exception classes here (BadRequestError,
		// NotFoundError): keep the message, give the type OpenAI's name.
		eb.Type = errorTypeFor(status)
	}
	if eb.Code == nil {
		eb.Code = codeFor(status)
	}
	out, _ := json.Marshal(apierror.Envelope{Error: eb})
	return out
}

func stringOrNull(r gjson.Result) bool {
	return r.Exists() && (r.Type == gjson.String || r.Type == gjson.Null)
}

// openAIType lists the error types OpenAI's API answers with, which pass
// through unchanged.
var openAIType = map[string]bool{
	"invalid_request_error": true, "authentication_error": true, "permission_error": true,
	"not_found_error": true, "rate_limit_error": true, "server_error": true, "api_error": true,
	"requests": true, "tokens": true, "insufficient_quota": true,
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
		return apierror.OrNil("model_not_found")
	case http.StatusTooManyRequests:
		return apierror.OrNil("rate_limit_exceeded")
	case http.StatusServiceUnavailable:
		return apierror.OrNil("service_unavailable")
	}
	return nil
}

// ReadErrorAnswer reads an error answer's body (up to 1 MiB) and closes
// it, then puts it back rewritten into OpenAI's envelope
// (NormalizeErrorBody), with its Content-Length.
func ReadErrorAnswer(resp *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("gateway: read upstream error: %w", err)
	}
	if fixed := NormalizeErrorBody(resp.StatusCode, body); fixed != nil {
		body = fixed
		resp.Header.Set("Content-Type", "application/json")
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}
