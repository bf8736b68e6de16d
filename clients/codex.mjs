// The Codex CLI (codex exec) with warmpath as a custom model provider, in a
// scratch HOME/CODEX_HOME with update checks and analytics off and a
// sandbox that lets it run its shell tool. It must complete a tool round
// trip (the model calls exec_command, Codex runs it and sends the output
// back) and exit 0.
import { spawnSync } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { baseURL, model, check, ok, main } from "./lib.mjs";

await main(async () => {
  const here = dirname(fileURLToPath(import.meta.url));
  const scratch = mkdtempSync(join(tmpdir(), "warmpath-codex-"));
  try {
    const home = join(scratch, "home"), codexHome = join(home, ".codex"), work = join(scratch, "work");
    mkdirSync(codexHome, { recursive: true });
    mkdirSync(work);
    writeFileSync(join(codexHome, "config.toml"), [
      `model = ${JSON.stringify(model)}`,
      `model_provider = "warmpath"`,
      `approval_policy = "never"`,
      `sandbox_mode = "danger-full-access"`,
      `check_for_update_on_startup = false`,
      ``,
      `[analytics]`,
      `enabled = false`,
      ``,
      `[model_providers.warmpath]`,
      `name = "warmpath"`,
      `base_url = ${JSON.stringify(baseURL)}`,
      `wire_api = "responses"`,
      `env_key = "WARMPATH_API_KEY"`,
      `request_max_retries = 0`,
      `stream_max_retries = 0`,
      ``,
    ].join("\n"));
    const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: codexHome, WARMPATH_API_KEY: "sk-test", NO_COLOR: "1", RUST_LOG: "error" };
    const res = spawnSync(join(here, "node_modules", ".bin", "codex"),
      ["exec", "--skip-git-repo-check", "--json", "--cd", work, "Use the exec_command tool to run a command."],
      { env, encoding: "utf8", timeout: 150_000, input: "" });
    const events = (res.stdout || "").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
    const detail = { status: res.status, signal: res.signal, stderr: (res.stderr || "").slice(-3000), events: events.map((e) => e.type + ":" + (e.item?.type ?? "")) };
    check(res.status === 0, "codex exec exits 0", detail);
    const commands = events.filter((e) => e.type === "item.completed" && e.item?.type === "command_execution");
    check(commands.length >= 1, "the model ran a shell command through Codex", detail);
    const messages = events.filter((e) => e.type === "item.completed" && e.item?.type === "agent_message");
    check(messages.length >= 1, "Codex got a final answer after the tool output", detail);
    check(events.some((e) => e.type === "turn.completed"), "turn completed", detail);
    const c = commands[0].item;
    console.log(`codex ran ${JSON.stringify(c.command)} (exit ${c.exit_code}); ${events.length} events; answer ${JSON.stringify(messages[0].item.text).slice(0, 80)}`);
    ok("codex exec tool round trip");
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
});
