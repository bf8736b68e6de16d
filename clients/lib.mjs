// Shared setup for the client scripts: responses/clients_test.go starts
// warmpath's Responses API over a simulated vLLM fleet and passes its
// address in OPENAI_BASE_URL (ending in /v1) and the model in
// WARMPATH_MODEL. Each script exits non-zero with a message on the first
// failed check.
export const baseURL = process.env.OPENAI_BASE_URL;
export const apiKey = process.env.OPENAI_API_KEY || "sk-test";
export const model = process.env.WARMPATH_MODEL || "qwen3-32b";
if (!baseURL) {
  console.error("OPENAI_BASE_URL is not set");
  process.exit(2);
}

export function check(cond, msg, extra) {
  if (!cond) {
    console.error("FAIL: " + msg + (extra === undefined ? "" : ": " + JSON.stringify(extra).slice(0, 2000)));
    process.exit(1);
  }
}

export function ok(name) {
  console.log("ok " + name);
}

export async function main(fn) {
  try {
    await fn();
  } catch (err) {
    console.error("FAIL: " + (err && err.stack ? err.stack : err));
    process.exit(1);
  }
}
