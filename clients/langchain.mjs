// @langchain/openai ChatOpenAI with useResponsesApi: tools bound, then the
// tool result sent chained with previous_response_id.
import { ChatOpenAI } from "@langchain/openai";
import { ToolMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { z } from "zod";
import { baseURL, apiKey, model, check, ok, main } from "./lib.mjs";

await main(async () => {
  const getWeather = tool(async ({ city }) => `sunny in ${city}`, {
    name: "get_weather",
    description: "Current weather for a city.",
    schema: z.object({ city: z.string() }),
  });
  const llm = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, useResponsesApi: true, maxRetries: 0 });
  const withTools = llm.bindTools([getWeather]);

  const ai = await withTools.invoke("Use the get_weather tool for Paris.");
  check(ai.tool_calls.length === 1 && ai.tool_calls[0].name === "get_weather", "tool call", ai.tool_calls);
  const id = ai.response_metadata.id;
  check(id && id.startsWith("resp_"), "response id", ai.response_metadata);
  ok("bindTools");

  const result = await getWeather.invoke(ai.tool_calls[0]);
  check(result instanceof ToolMessage, "tool message", result);
  const answer = await withTools.invoke([result], { previous_response_id: id });
  check(typeof answer.content === "string" ? answer.content.length > 0 : answer.content.length > 0, "answer", answer.content);
  check(answer.response_metadata.id !== id && answer.tool_calls.length === 0, "chained answer", answer.response_metadata);
  ok("previous_response_id");

  const plain = await llm.invoke("Say hi.");
  check(plain.text.length > 0, "plain invoke", plain);
  ok("plain");
});
