// js_encode_cases.mjs - the JS side of check_forge_vocabs.sh: ids of a text and of each line
// from a HF tokenizer.json dir with @lenml/tokenizers (NPM_DIR holds node_modules).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
const require = createRequire((process.env.NPM_DIR || "/work/npmtok") + "/package.json");
const { TokenizerLoader } = require("@lenml/tokenizers");
const [, , dir, textPath] = process.argv;
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: JSON.parse(readFileSync(dir + "/tokenizer.json", "utf8")), tokenizerConfig: JSON.parse(readFileSync(dir + "/tokenizer_config.json", "utf8")) });
const text = readFileSync(textPath, "utf8");
for (const s of [text, ...text.split(/(?<=\n)/)]) console.log(tok.encode(s, { add_special_tokens: false }).join(" "));
