// Package anthropic serves Anthropic's Messages API (POST /v1/messages,
// with or without ?beta=true, and POST /v1/messages/count_tokens) over a
// self-hosted vLLM fleet, so Claude Code and the Anthropic SDKs run
// against warmpath. It translates each request into a /v1/chat/completions
// request sent through the gateway's routed client (the chatapi.Chat
// seam), so routing, tokenizing, admission and accounting are the chat
// path's, and turns the chat stream back into the Messages event sequence
// (read with chatapi.Reader, written with chatapi.Writer). It owns no
// routing, authentication or state: the gateway provides them through Chat
// and Options.
//
// # Translation (Messages → chat)
//
// Mapped:
//
//	system (string or text blocks)   one leading system message, blocks joined by
//	                                 a blank line, less Claude Code's billing line
//	role "system" in messages        a system message in place (never hoisted)
//	role ctx, msg                    user
//	text, image (base64, url)        text and image_url parts; text-only content is
//	                                 a string, parts joined by "\n"
//	document (text), search_result   text
//	tool_use                         assistant tool_calls, input as compact JSON
//	                                 (key order kept), id kept byte for byte
//	tool_result                      a tool message (text joined by "\n", "Error: "
//	                                 first when is_error), placed before the rest
//	                                 of its user turn; its images follow in a user
//	                                 message
//	tools (client)                   functions (input_schema → parameters, type
//	                                 object when missing)
//	tool_choice auto/any/tool/none   auto/required/function/none;
//	disable_parallel_tool_use        parallel_tool_calls false
//	max_tokens, stop_sequences       max_tokens, stop
//	temperature, top_p, top_k        the same
//	output_config.effort             reasoning_effort (xhigh, max → high)
//	output_config.format             response_format json_schema
//	a final assistant message        continue_final_message (a prefill)
//	metadata.user_id's session id    X-Claude-Code-Session-Id when absent
//
// Dropped on purpose: thinking (the served model's reasoning parser
// decides; reasoning comes back as thinking blocks), thinking and
// redacted_thinking blocks sent back (vLLM's templates drop past
// reasoning), cache_control everywhere (vLLM caches every prefix by
// itself), context_management (server-side edits; the history is sent
// whole), server tools (web search, code execution…) and their result
// blocks, tool_reference and container_upload blocks, metadata,
// service_tier, container, mcp_servers, inference_geo, speed, and the
// anthropic-version and anthropic-beta headers. Refused with 400: PDF,
// URL and file documents, file images, and unknown block types.
//
// # Determinism and the prefix cache
//
// The chat body is a pure function of the request, and each message
// renders independently of the ones after it. Claude Code resends the
// whole history every turn, so turn N+1's chat messages begin byte for
// byte with turn N's, and the engine's prompt for turn N+1 begins with its
// prompt for turn N. The one part of Claude Code's requests that changes
// every time, the x-anthropic-billing-header line of its first system
// block, is removed.
//
// # Answers (chat → Messages)
//
// The upstream always streams; one translator builds both answers. A
// stream is message_start and a ping at once (usage is not known yet),
// then a content block per run of reasoning (thinking, with a
// signature_delta before it stops), text, or one tool call (tool_use,
// arguments as input_json_delta), with dense indexes from 0, then
// message_delta with the stop reason and the cumulative usage, and
// message_stop; a ping follows any PingInterval of silence. An upstream
// failure after the headers (an error chunk, a cut stream) is an error
// event. A non-streaming request gets the Message the events add up to,
// or the failure as an error status. Usage: input_tokens = prompt_tokens −
// cached_tokens, cache_read_input_tokens = cached_tokens,
// cache_creation_input_tokens = 0, output_tokens = completion_tokens.
// Stop reasons: length → max_tokens, tool_calls → tool_use,
// content_filter → refusal, a matched stop string → stop_sequence, else
// end_turn.
//
// # Errors
//
// Every error is {"type":"error","error":{"type","message"},"request_id"}
// with the status of the failure (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 500 api_error, 503
// overloaded_error, 504 timeout_error), keeping Retry-After and the
// rate-limit headers. Every response carries request-id.
//
// # Goroutines
//
// None of its own: requests run on the server's goroutines, and a stream's
// ping timer (time.AfterFunc) is stopped before its handler returns. New
// starts nothing. The package keeps no Redis keys.
package anthropic
