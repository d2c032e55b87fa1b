// jinja_expected.mjs - renders chat templates with @huggingface/jinja (the Jinja implementation
// transformers.js uses for apply_chat_template) to make tests/tokenizer/data/chat_jinja.txt, the
// expected prompts that tests/tokenizer/test_chat.c compares hotmoe's fixed formatters against.
//
//   npm install @huggingface/jinja@0.5.11     (in some scratch directory; MIT licence)
//   NODE_PATH=that/node_modules node tools/chat/jinja_expected.mjs NAME=FILE ... > OUT
//
// The committed fixture was made (2026-11-22) from tiny models forged with `hotmoe forge
// --preset P --type q8_0 --no-hf` and the two template files in tests/tokenizer/data:
//   node tools/chat/jinja_expected.mjs forge-qwen3moe=tiny-qwen3moe.gguf \
//     forge-mixtral=tiny-mixtral.gguf forge-olmoe=tiny-olmoe.gguf forge-gpt-oss=tiny-gpt-oss.gguf \
//     forge-qwen2moe=tiny-qwen2moe.gguf qwen3=tests/tokenizer/data/qwen3.jinja \
//     mixtral=tests/tokenizer/data/mixtral-instruct.jinja > tests/tokenizer/data/chat_jinja.txt
//   node tools/chat/jinja_expected.mjs harmony-openai=openai-gpt-oss-120b.jinja \
//     >> tests/tokenizer/data/chat_jinja.txt
// (the last one: OpenAI's gpt-oss template, not committed; @huggingface/jinja's strftime_now
// gives the day it runs, 2026-11-22 in the fixture). The forge-gpt-oss records were re-made
// (2026-11-22, 13:05 UTC) after forge's harmony template changed to {{ '\n' }} newlines, from
// `forge-gpt-oss=tiny-gpt-oss.gguf` alone, and spliced in place of the old records.
//
// FILE is a GGUF (its tokenizer.chat_template is read) or a text file holding a template.
// Every template is rendered for every conversation below, with and without the generation
// prompt, and (when the template reads enable_thinking) with enable_thinking=false; bos_token
// "<s>", eos_token "</s>". A template error (raise_exception) is recorded as "!error".
// Output records: "case NAME CONV ADD_GEN THINK NBYTES\n" + NBYTES bytes + "\n".
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const { Template } = require("@huggingface/jinja");

// The GGUF metadata value `tokenizer.chat_template` (GGUF v2/v3 little-endian).
function ggufTemplate(buf) {
  let o = 0;
  const u32 = () => { const v = buf.readUInt32LE(o); o += 4; return v; };
  const u64 = () => { const v = Number(buf.readBigUInt64LE(o)); o += 8; return v; };
  const str = () => { const n = u64(); const s = buf.toString("utf8", o, o + n); o += n; return s; };
  const size = [1, 1, 2, 2, 4, 4, 4, 1, -1, -1, 8, 8, 8]; // by GGUF value type
  const skip = (t) => {
    if (t === 8) { const n = u64(); o += n; return; }
    if (t === 9) { const et = u32(), n = u64(); for (let i = 0; i < n; i++) skip(et); return; }
    o += size[t];
  };
  if (buf.toString("ascii", 0, 4) !== "GGUF") throw new Error("not a GGUF file");
  o = 8;
  u64(); // tensors
  const nkv = u64();
  for (let i = 0; i < nkv; i++) {
    const key = str(), t = u32();
    if (key === "tokenizer.chat_template" && t === 8) return str();
    skip(t);
  }
  throw new Error("no tokenizer.chat_template");
}

const convs = {
  sys4: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" },
         { role: "assistant", content: "Hello!" }, { role: "user", content: "2+2?" }],
  user1: [{ role: "user", content: "Hi" }],
  user3: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello!" },
          { role: "user", content: "2+2?" }],
  think: [{ role: "user", content: "a" },
          { role: "assistant", content: "<think>\nplan\n</think>\n\nanswer" },
          { role: "user", content: "b" }],
  ua: [{ role: "user", content: "a" }, { role: "assistant", content: "answer" }],
  text: [{ role: "system", content: "Sys\nline two" },
         { role: "user", content: "Grüße 👋\n  indented {{ not jinja }}" },
         { role: "assistant", content: " lead space\n" }, { role: "user", content: "x" }],
  sysonly: [{ role: "system", content: "only" }],
};

let out = "";
for (const arg of process.argv.slice(2)) {
  const eq = arg.indexOf("=");
  const name = arg.slice(0, eq), file = arg.slice(eq + 1);
  const buf = readFileSync(file);
  const src = buf.toString("ascii", 0, 4) === "GGUF" ? ggufTemplate(buf) : buf.toString("utf8");
  const tmpl = new Template(src);
  const thinks = src.includes("enable_thinking") ? [-1, 0] : [-1];
  for (const [cname, messages] of Object.entries(convs)) {
    for (const addGen of [1, 0]) {
      for (const think of thinks) {
        const ctx = { messages, add_generation_prompt: !!addGen, bos_token: "<s>", eos_token: "</s>" };
        if (think >= 0) ctx.enable_thinking = !!think;
        let text;
        try { text = tmpl.render(ctx); } catch (e) { text = "!error"; }
        const b = Buffer.from(text, "utf8");
        out += `case ${name} ${cname} ${addGen} ${think} ${b.length}\n` + text + "\n";
      }
    }
  }
}
process.stdout.write(out);
