// The reference for hftok's in-process tokenizer (hftok/transformers_test.go):
// transformers.js tokenizes vLLM POST /tokenize bodies with a model's own
// tokenizer.json and chat template, loaded from local files only.
//
// Usage: node hftok.mjs MODEL_DIR < bodies.json > answers.json
// bodies.json is a JSON array of /tokenize bodies; each answer is
// {"text": the rendered chat or prompt, "ids": [...]} or {"error": "..."}.
// Messages are first reduced as vLLM's chat_utils does (string content
// format): text parts joined by "\n", null content as "", tool call
// arguments parsed from JSON, tools as pydantic's model_dump lays them out.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { AutoTokenizer, env } from '@huggingface/transformers';

const dir = path.resolve(process.argv[2]);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(dir);
const tok = await AutoTokenizer.from_pretrained(path.basename(dir));

function vllmMessage(m) {
  let content = m.content;
  if (content == null) content = '';
  else if (Array.isArray(content)) {
    content = content.map((p) => (typeof p === 'string' ? p : p.text)).filter((t) => t != null).join('\n');
  }
  const out = { role: m.role, content };
  if (m.role === 'assistant' && m.tool_calls != null) {
    if (m.tool_calls.length > 0) {
      out.tool_calls = m.tool_calls.map((c) => {
        let args = c.function.arguments;
        if (typeof args === 'string') {
          try { args = args === '' ? {} : JSON.parse(args); } catch { args = {}; }
        }
        if (args == null || typeof args !== 'object' || Array.isArray(args)) args = {};
        return { ...c, function: { ...c.function, arguments: args } };
      });
    }
    if (m.reasoning != null) { out.reasoning = m.reasoning; out.reasoning_content = m.reasoning; }
  }
  if (m.role === 'tool' && 'tool_call_id' in m) out.tool_call_id = m.tool_call_id;
  if (typeof m.name === 'string') out.name = m.name;
  return out;
}

function vllmTool(t) {
  const f = t.function;
  const fn = { name: f.name, description: f.description ?? null, parameters: f.parameters ?? null, ...f };
  return { type: t.type ?? 'function', function: fn, ...Object.fromEntries(Object.entries(t).filter(([k]) => k !== 'type' && k !== 'function')) };
}

function answer(body) {
  if (body.messages) {
    const text = tok.apply_chat_template(body.messages.map(vllmMessage), {
      tools: body.tools ? body.tools.map(vllmTool) : null,
      add_generation_prompt: body.add_generation_prompt ?? true,
      tokenize: false,
    });
    return { text, ids: tok.encode(text, { add_special_tokens: body.add_special_tokens ?? false }) };
  }
  return { text: body.prompt, ids: tok.encode(body.prompt, { add_special_tokens: body.add_special_tokens ?? true }) };
}

const bodies = JSON.parse(readFileSync(0, 'utf8'));
const answers = bodies.map((b) => {
  try { return answer(b); } catch (e) { return { error: String(e) }; }
});
process.stdout.write(JSON.stringify(answers));
