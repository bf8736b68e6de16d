// The openai npm client: responses.create, streaming, chaining with
// previous_response_id, retrieve, and the previous_response_not_found error.
import OpenAI from "openai";
import { baseURL, apiKey, model, check, ok, main } from "./lib.mjs";

await main(async () => {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

  const r1 = await client.responses.create({ model, instructions: "Be brief.", input: "Tell me about Paris." });
  check(r1.status === "completed" && r1.output_text.length > 0, "create", r1);
  check(r1.usage.input_tokens > 0 && r1.usage.input_tokens_details.cached_tokens >= 0, "usage", r1.usage);
  ok("create");

  const stream = await client.responses.create({ model, instructions: "Be brief.", input: "And London?", previous_response_id: r1.id, stream: true });
  let seq = 0, text = "", done = null;
  for await (const ev of stream) {
    check(ev.sequence_number === seq, "sequence_number", ev);
    seq++;
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed") done = ev.response;
  }
  check(done && done.status === "completed" && done.previous_response_id === r1.id, "stream completed", done);
  check(done.output[0].content[0].text === text, "deltas add up to the text");
  check(done.usage.input_tokens_details.cached_tokens > 0, "chained turn hits the prefix cache", done.usage);
  ok("stream+chain");

  const got = await client.responses.retrieve(done.id);
  check(got.id === done.id && got.output_text === text, "retrieve", got);
  const items = await client.responses.inputItems.list(done.id);
  check(items.data.length === 1 && items.data[0].id, "input items", items.data);
  ok("retrieve");

  try {
    await client.responses.create({ model, input: "x", previous_response_id: "resp_gone" });
    check(false, "unknown previous response must fail");
  } catch (err) {
    check(err.status === 400 && err.code === "previous_response_not_found" && err.param === "previous_response_id", "not found error", { status: err.status, code: err.code });
  }
  ok("previous_response_not_found");
});
