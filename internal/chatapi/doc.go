// Package chatapi is what warmpath's API fronts share: chat and
// completions (package gateway), the Responses and Conversations APIs
// (package responses) and the Anthropic Messages API (package anthropic).
// It owns the [Chat] interface through which a front sends its turn to the
// routed client; the [Reader] of an upstream chat-completions event
// stream; the [Writer] of a front's own event stream (event by event,
// flushed, never buffered); [ReadBody] (size-limited), [WriteJSON] and
// [Marshal]; and the request id ([RequestID], [NewRequestID]).
//
// Errors are values: the kit returns them, and each front renders them in
// its own envelope (OpenAI's through package apierror, Anthropic's in
// package anthropic). A refusal crosses the Chat seam as an
// *apierror.Error, never as an error body to parse again.
//
// The package keeps no state and starts no goroutines.
package chatapi
