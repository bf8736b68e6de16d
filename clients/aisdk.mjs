// The Vercel AI SDK (ai + @ai-sdk/openai) with its default provider, which
// speaks Responses: a multi-step tool loop, a follow-up turn that sends
// earlier assistant items as item_reference, and a streamed turn.
import { generateText, streamText, tool, stepCountIs } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";
import { baseURL, apiKey, model, check, ok, main } from "./lib.mjs";

await main(async () => {
  const openai = createOpenAI({ baseURL, apiKey });
  let calls = 0;
  const tools = {
    get_weather: tool({
      description: "Current weather for a city.",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => { calls++; return `sunny in ${city}`; },
    }),
  };
  const r1 = await generateText({
    model: openai(model), tools, stopWhen: stepCountIs(5), maxRetries: 0,
    system: "You answer weather questions.",
    prompt: "Use the get_weather tool for Paris.",
  });
  check(calls === 1 && r1.steps.length === 2 && r1.text.length > 0, "tool loop", { calls, steps: r1.steps.length, text: r1.text });
  check(r1.usage.inputTokens > 0, "usage", r1.usage);
  ok("multi-step tool loop");

  const messages = [{ role: "user", content: "Use the get_weather tool for Paris." }, ...r1.response.messages,
    { role: "user", content: "Thanks. Summarise that in one line." }];
  const r2 = await generateText({ model: openai(model), tools, system: "You answer weather questions.", messages, maxRetries: 0 });
  check(r2.text.length > 0 && calls === 1, "follow-up with item references", { text: r2.text, calls });
  check((r2.usage.cachedInputTokens ?? r2.usage.inputTokenDetails?.cacheReadTokens ?? 0) > 0, "follow-up hits the prefix cache", r2.usage);
  ok("item_reference follow-up");

  const s = streamText({ model: openai(model), prompt: "Stream a short story.", maxRetries: 0 });
  let text = "";
  for await (const part of s.textStream) text += part;
  check(text.length > 0 && (await s.text) === text, "streamText", text);
  ok("streamText");
});
