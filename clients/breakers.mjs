// The openai npm client as four chat clients that differ in prompt
// discipline (gateway/misses_clients_test.go): WARMPATH_CLIENT=timestamp
// puts the current time at the start of its system prompt every turn,
// shuffle shuffles its tool list every turn, rewrite rewrites its first
// answer from its third turn on (an agent that compacts its history), and good
// only appends. Each runs WARMPATH_TURNS turns of one conversation
// through chat.completions.create; the gateway is asked afterwards what
// it diagnosed.
import OpenAI from "openai";
import { baseURL, apiKey, model, check, ok, main } from "./lib.mjs";

const mode = process.env.WARMPATH_CLIENT || "good";
const turns = Number(process.env.WARMPATH_TURNS || "5");
const words = (seed, n) => Array.from({ length: n }, (_, i) => `${seed}${i}`).join(" ");
const system = "You are a careful assistant. " + words("rule", 120);
const tools = ["search", "fetch", "calendar", "weather", "translate", "calculator"].map((name) => ({
  type: "function",
  function: { name, description: `The ${name} tool. ` + words(name, 12), parameters: { type: "object", properties: { q: { type: "string" } } } },
}));

// shuffled returns a permutation of list other than the one it is in.
function shuffled(list) {
  for (;;) {
    const out = [...list];
    for (let i = out.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [out[i], out[j]] = [out[j], out[i]];
    }
    if (out.some((t, i) => t !== list[i])) return out;
  }
}

await main(async () => {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const first = "Plan my week. " + words(`ask${mode}`, 30);
  const history = [{ role: "user", content: first }];
  let toolList = tools;
  for (let turn = 0; turn < turns; turn++) {
    let sys = system;
    if (mode === "timestamp") sys = `Current time: ${new Date().toISOString()}. ` + system;
    if (mode === "shuffle" && turn > 0) toolList = shuffled(toolList);
    if (mode === "rewrite" && turn > 1) history[1] = { role: "assistant", content: `Summary of my first answer, revision ${turn}.` };
    const r = await client.chat.completions.create({
      model, max_tokens: 16, tools: toolList, messages: [{ role: "system", content: sys }, ...history],
    });
    check(r.choices.length === 1 && r.usage.prompt_tokens > 0, "completion", r);
    history.push({ role: "assistant", content: r.choices[0].message.content || "" });
    history.push({ role: "user", content: words(`next${turn}`, 20) });
    ok(`${mode} turn ${turn}: prompt ${r.usage.prompt_tokens} cached ${r.usage.prompt_tokens_details?.cached_tokens ?? 0}`);
  }
});
