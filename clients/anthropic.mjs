// The @anthropic-ai/sdk client against warmpath's Messages API
// (gateway/messages_clients_test.go passes ANTHROPIC_BASE_URL, without
// /v1, and ANTHROPIC_API_KEY, sent as x-api-key): a message, a raw stream
// whose event sequence is checked, a tool-use loop through the beta client
// (POST /v1/messages?beta=true, as Claude Code sends) with the
// MessageStream helper, count_tokens, and the SDK's typed errors.
import Anthropic from "@anthropic-ai/sdk";
import { model, check, ok, main } from "./lib.mjs";

const baseURL = process.env.ANTHROPIC_BASE_URL;
const apiKey = process.env.ANTHROPIC_API_KEY;
check(baseURL && apiKey, "ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY must be set");

await main(async () => {
  const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
  const system = [{ type: "text", text: "You are a travel guide. Be brief. ".repeat(40), cache_control: { type: "ephemeral" } }];

  const m1 = await client.messages.create({ model, max_tokens: 32, system, messages: [{ role: "user", content: "Tell me about Paris." }] });
  check(m1.type === "message" && m1.role === "assistant" && m1.id.startsWith("msg_"), "create", m1);
  check(m1.content.length === 1 && m1.content[0].type === "text" && m1.content[0].text.length > 0, "text block", m1.content);
  check(["end_turn", "max_tokens"].includes(m1.stop_reason) && m1.stop_sequence === null, "stop_reason", m1);
  check(m1.usage.input_tokens > 200 && m1.usage.cache_creation_input_tokens === 0 && m1.usage.output_tokens > 0, "usage", m1.usage);
  check(typeof m1._request_id === "string" && m1._request_id.startsWith("req_"), "request-id", m1._request_id);
  ok("create");

  // A raw stream: the SDK yields only named events, in this order.
  const history = [{ role: "user", content: "Tell me about Paris." }, { role: "assistant", content: m1.content }, { role: "user", content: "And London?" }];
  const stream = await client.messages.create({ model, max_tokens: 32, system, messages: history, stream: true });
  const names = [];
  let text = "", usage = null, start = null;
  for await (const ev of stream) {
    names.push(ev.type);
    if (ev.type === "message_start") start = ev.message;
    if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") text += ev.delta.text;
    if (ev.type === "message_delta") usage = ev.usage;
  }
  check(names[0] === "message_start" && start.content.length === 0 && start.stop_reason === null, "message_start first", names);
  check(names.at(-1) === "message_stop" && names.at(-2) === "message_delta", "message_delta, message_stop last", names);
  check(names[1] === "content_block_start" && names.at(-3) === "content_block_stop", "one content block", names);
  check(text.length > 0, "text deltas");
  // Anthropic's input_tokens excludes the cached prefix: turn 2 reads turn 1's prompt from cache.
  check(usage.cache_read_input_tokens >= m1.usage.input_tokens - 16 && usage.input_tokens < usage.cache_read_input_tokens, "second turn hits the cache", usage);
  ok("stream");

  // A tool-use loop through the beta client and the MessageStream helper.
  const tools = [{ name: "get_weather", description: "The weather in a city", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
  const messages = [{ role: "user", content: "Use the get_weather tool for Paris." }];
  const ms = client.beta.messages.stream({ model, max_tokens: 64, system, tools, messages, betas: ["interleaved-thinking-2025-05-14"] });
  let inputJSON = 0;
  ms.on("inputJson", () => inputJSON++);
  const first = await ms.finalMessage();
  const use = first.content.find((b) => b.type === "tool_use");
  check(first.stop_reason === "tool_use" && use && use.name === "get_weather" && typeof use.input.city === "string", "tool call", first);
  check(inputJSON > 0, "input_json_delta events");
  messages.push({ role: "assistant", content: first.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "Sunny, 21 degrees." }] });
  const second = await client.beta.messages.create({ model, max_tokens: 64, system, tools, messages });
  check(second.stop_reason === "end_turn" && second.content[0].type === "text", "answer after the tool result", second);
  check(second.usage.cache_read_input_tokens > 0, "the tool result turn hits the cache", second.usage);
  ok("tool loop");

  const count = await client.messages.countTokens({ model, system, tools, messages });
  const prompted = second.usage.input_tokens + second.usage.cache_read_input_tokens;
  check(count.input_tokens === prompted, "count_tokens agrees with the prompt the engine saw", { count, prompted });
  ok("count_tokens");

  try {
    await client.messages.create({ model: "no-such-model", max_tokens: 5, messages: [{ role: "user", content: "x" }] });
    check(false, "an unknown model must fail");
  } catch (err) {
    check(err instanceof Anthropic.NotFoundError && err.error?.error?.type === "not_found_error", "not_found_error", { status: err.status, error: err.error });
  }
  try {
    await new Anthropic({ baseURL, apiKey: "sk-wp-wrong", maxRetries: 0 }).messages.create({ model, max_tokens: 5, messages: [{ role: "user", content: "x" }] });
    check(false, "a wrong key must fail");
  } catch (err) {
    check(err instanceof Anthropic.AuthenticationError && err.error?.error?.type === "authentication_error", "authentication_error", { status: err.status, error: err.error });
  }
  ok("errors");
});
