package proxy

import (
	"net/http"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// endAttempt ends a failed attempt's span (nil: tracing is off).
func endAttempt(span trace.Span, resp *http.Response, err error) {
	if span == nil {
		return
	}
	if resp != nil {
		span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
		if resp.StatusCode >= 500 {
			span.SetStatus(codes.Error, resp.Status)
		}
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// answered notes the answering attempt's status on its span (nil:
// tracing is off), which the caller ends with the body.
func answered(span trace.Span, resp *http.Response) trace.Span {
	if span == nil {
		return nil
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, resp.Status)
	}
	return span
}
