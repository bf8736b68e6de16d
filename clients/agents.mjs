// @openai/agents: a tool-using agent, chained with previousResponseId, and
// a streamed run. Tracing is off (it would export to OpenAI).
import OpenAI from "openai";
import { Agent, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from "@openai/agents";
import { z } from "zod";
import { baseURL, apiKey, model, check, ok, main } from "./lib.mjs";

await main(async () => {
  setTracingDisabled(true);
  setOpenAIAPI("responses");
  setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey, maxRetries: 0 }));

  let calls = 0;
  const getWeather = tool({
    name: "get_weather",
    description: "Current weather for a city.",
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => { calls++; return `sunny in ${city}`; },
  });
  const agent = new Agent({ name: "weather", instructions: "You answer weather questions.", model, tools: [getWeather] });

  const r1 = await run(agent, "Use the get_weather tool for Paris.");
  check(calls === 1 && typeof r1.finalOutput === "string" && r1.finalOutput.length > 0, "tool run", { calls, out: r1.finalOutput });
  check(r1.lastResponseId && r1.lastResponseId.startsWith("resp_"), "lastResponseId", r1.lastResponseId);
  ok("tool run");

  const r2 = await run(agent, "Use the get_weather tool again, for Rome.", { previousResponseId: r1.lastResponseId });
  check(calls === 2 && r2.finalOutput.length > 0, "chained tool run", { calls, out: r2.finalOutput });
  ok("previousResponseId");

  const streamed = await run(agent, "Use the get_weather tool for Oslo.", { stream: true, previousResponseId: r2.lastResponseId });
  let deltas = 0;
  for await (const ev of streamed) {
    if (ev.type === "raw_model_stream_event" && ev.data.type === "output_text_delta") deltas++;
  }
  await streamed.completed;
  check(calls === 3 && deltas > 0 && streamed.finalOutput.length > 0, "streamed run", { calls, deltas, out: streamed.finalOutput });
  ok("streamed run");
});
